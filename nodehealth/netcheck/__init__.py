"""netcheck: a job's network preflight. The rounds and their verdict are pure (rounds); the agent runs
on every node (agent: its requests and the rendezvous; listener: bounded connections; admission: who
may ask what; stream: the TCP test; wire: the JSON lines); the coordinator claims the agents and runs
the rounds (coordinator); discovery finds the job's nodes; preflight is the commands."""
