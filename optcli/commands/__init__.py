"""The `optcli` subcommands beside `opt`: one module each (inspect, run, bench), registered in cli.py."""
