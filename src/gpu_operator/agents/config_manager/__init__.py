"""The config-manager agent: picks the device-plugin/GFD config named by a node label.

`selection` decides (pure), `files` lists configs and swaps the symlink, `signals` tells the
operand to reload, `runner` ties them to the label watch and `command` wires the CLI.
"""
