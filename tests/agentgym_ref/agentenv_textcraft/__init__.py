# Not AgentGym's (its imports the server, which loads recipes at import): import modules.
