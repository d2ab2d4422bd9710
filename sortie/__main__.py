from sortie.cli.app import entry

entry()
