"""The live daemon: the loop that reads what changed, the service that wires the stages
to it, what a restart keeps, and the process around them (signals, systemd, memory)."""
