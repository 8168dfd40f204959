"""A vLLM 0.32 (V1 engine) OpenAI-compatible server simulator with fault injection.

Entry points: `simulator.server` (SimConfig, SimServer, build_app), `simulator.testing`
(running_simulator, simulator_process), `simulator.load` (run_load), `simulator.proxy`. The
server's OpenAI-compatible wire format is in `simulator.api`, its faults in `simulator.faults`.
"""
