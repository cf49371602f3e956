# CPU worker: runs flows (exploration, evaluation, small trainings) on a Prefect work pool.
# Build from the repository root: docker build -f docker/worker.Dockerfile -t flywheel-worker .
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends build-essential git make \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/flywheel
COPY . .
RUN FLYWHEEL_DEVICE=cpu bash scripts/install.sh
ENV PATH=/opt/flywheel/.venv/bin:$PATH PREFECT_HOME=/opt/flywheel/.prefect
CMD ["prefect", "worker", "start", "--pool", "flywheel-docker"]
