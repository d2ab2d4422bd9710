from sortie.cli.start import entry

entry()
