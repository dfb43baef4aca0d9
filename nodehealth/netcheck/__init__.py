"""netcheck: a job's network preflight. The rounds and their verdict are pure (rounds); the agent, its
stream test and the rendezvous run on every node (agent); discovery finds the job's nodes; preflight
is the commands."""
