"""AgentGym's HTTP protocol, both ways: the client (`client`: episodes on AgentGym's servers or
Flywheel's), the server (`server`: a Flywheel environment served over the protocol), the
compatibility mode (`compat`: answering as AgentGym's own servers do), the experts of AgentGym's
task texts (`expert`), and one object per server family (`dialects`: every rule that differs
between them). docs/agentgym.md."""
