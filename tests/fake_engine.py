"""A stand-in for vLLM's engine processes, named as vLLM names them (prctl PR_SET_NAME): an
engine core that starts a worker ignoring SIGTERM (as a busy one may not get to it); the worker
prints its pid once it runs, and both wait, as a live engine does."""

ENGINE_WITH_WORKER = """
import ctypes, subprocess, sys, time
ctypes.CDLL(None).prctl(15, b"VLLM::EngineCor", 0, 0, 0)
worker = '''
import ctypes, os, signal, time
ctypes.CDLL(None).prctl(15, b"VLLM::Worker", 0, 0, 0)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(os.getpid(), flush=True)
time.sleep(120)
'''
subprocess.Popen([sys.executable, "-c", worker], stdout=sys.stdout)
time.sleep(120)
"""
