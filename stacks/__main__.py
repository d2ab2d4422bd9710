from stacks.cli import entry

entry()
