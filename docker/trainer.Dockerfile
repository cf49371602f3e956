# CUDA trainer: torch + vLLM for GPUs, accelerate/DeepSpeed for multi-GPU training.
# Build from the repository root: docker build -f docker/trainer.Dockerfile -t flywheel-trainer .
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
RUN apt-get update && apt-get install -y --no-install-recommends python3.12 python3.12-venv \
    python3.12-dev build-essential git make && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/flywheel
COPY . .
RUN PYTHON=python3.12 FLYWHEEL_DEVICE=cuda bash scripts/install.sh
ENV PATH=/opt/flywheel/.venv/bin:$PATH PREFECT_HOME=/opt/flywheel/.prefect \
    FLYWHEEL_HOME=/opt/flywheel
# As the job image of a docker or kubernetes work pool, Prefect runs each flow run in it (the
# deployments in deployments/prefect.yaml name it). Run as is, it is a process worker itself.
CMD ["prefect", "worker", "start", "--pool", "flywheel-process"]
