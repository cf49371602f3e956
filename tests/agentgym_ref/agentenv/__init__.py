__all__ = ["controller", "envs", "trainer"]
