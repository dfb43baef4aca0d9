"""The remediation hook: a face that tells a site's own remediation when a finding appears or clears.

On each such transition it runs a configured command (an argv list, never a shell; the event as JSON
on stdin) or POSTs the same JSON to a configured URL, or both: each run bounded in time, a few at
once, rate-limited, its outcome in metrics, in the log and, on Kubernetes, in an Event on the Node.
Nothing destructive ships: the hook is off and has no command until a site configures one.

defaults, runner (one command or one POST, bounded), hook (the face: transitions, queue, workers).
"""
