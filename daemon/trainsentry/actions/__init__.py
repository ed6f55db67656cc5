"""What a rule may do besides telling people (opt-in per rule, `actions:`).

stop_file.py  write `<run dir>/.trainsentry/STOP` that the probe and training loops check
command.py    run a command, argument list, alert in the environment, with a timeout
"""
