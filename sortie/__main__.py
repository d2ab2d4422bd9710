from sortie.cli import entry

entry()
