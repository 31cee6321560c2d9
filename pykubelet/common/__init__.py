"""What every layer may use: the agent's options, the machine's facts, events and metrics."""
