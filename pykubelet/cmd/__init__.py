"""What the command line runs: flags and the --config file, the pykubelet get/logs/describe
client, log formats.
"""
