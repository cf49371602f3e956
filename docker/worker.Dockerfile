# CPU worker: runs flows (exploration, evaluation, small trainings) on a Prefect work pool.
# Build from the repository root: docker build -f docker/worker.Dockerfile -t flywheel-worker .
FROM python:3.11-slim
# Java 17: ScienceWorld runs in a JVM.
RUN apt-get update && apt-get install -y --no-install-recommends build-essential git make \
    openjdk-17-jre-headless && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/flywheel
COPY . .
RUN FLYWHEEL_DEVICE=cpu bash scripts/install.sh
ENV PATH=/opt/flywheel/.venv/bin:$PATH PREFECT_HOME=/opt/flywheel/.prefect \
    FLYWHEEL_HOME=/opt/flywheel
# As the job image of a docker or kubernetes work pool, Prefect runs each flow run in it (the
# deployments in deployments/prefect.yaml name it). Run as is, it is a process worker itself.
CMD ["prefect", "worker", "start", "--pool", "flywheel-process"]
# The same image serves environments for exploration on other machines:
#   docker run -p 36001:36001 flywheel-worker flywheel serve-env --env textcraft --host 0.0.0.0
