"""ART·E on real Enron mail: the inbox database, the agent and its tools, questions, rewards and the eval
harness (`harness`: accuracy, turns, latency and cost against baselines)."""
