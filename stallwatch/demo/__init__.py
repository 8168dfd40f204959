"""`stallwatch demo`: the whole pipeline on one machine, playing the incident stallwatch is for.

What runs (every process on loopback, in its own process group, stopped at the end):

- two simulated vLLM servers, `gpu-a` and `gpu-b` (`stallwatch sim`), and the simulator's
  least-connection proxy `gateway` in front of them;
- the exporter (`stallwatch exporter`, 1 s interval) watching both servers and the proxy;
- real Prometheus and Alertmanager (`stallwatch.localstack`) with the project's own rules and
  routing, rewritten only for timing and addresses;
- the restarter (`stallwatch restarter`) with a `command` action that asks the demo's small
  supervisor to stop the server's process and start a new one on the same port.

The story:

1. a batch job fills every slot of gpu-a with long generations. An old-style watchdog's test
   request queues behind them and times out; stallwatch reads `busy` and sends nothing;
2. a long prompt runs on gpu-b: a chunked prefill, engine step count flat, KV cache rising.
   stallwatch reads `busy`, never stuck;
3. gpu-b really hangs while serving traffic: the exporter reads `stalled`, LLMServerStuck fires
   after two stalled polls, Alertmanager routes it to the restarter, the restarter confirms
   with two fresh reads and runs its action, a new process comes up, the alert resolves.

A timeline is printed while it runs, a summary table at the end, and optionally a JSON summary.

The parts: `configs` (the servers and the configs generated for them), `supervisor` (restarts
a simulator process for the restarter; `stallwatch demo restart-helper` is its client),
`pipeline` (starts and stops every process), `observer` (samples the pipeline and tells what
happens), `timeline` (the lines it prints), `traffic` (clients that keep a server busy),
`script` (the three acts), `summary` (tallies and the closing table), `run` (runs it all) and
`cli` (the `stallwatch demo` subcommand).
"""
