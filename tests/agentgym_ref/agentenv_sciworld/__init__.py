# Not AgentGym's (its imports the server, which starts a JVM at import): import modules.
