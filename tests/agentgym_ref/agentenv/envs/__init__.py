# Not AgentGym's (its imports every environment's client): import the clients by module.
