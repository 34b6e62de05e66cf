# The debatebus worker with the embedded local model (llama-cpp-python built for portable x86-64).
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends build-essential cmake git \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY src ./src
COPY scripts ./scripts
RUN pip install --no-cache-dir -e ".[redis,kafka,metrics,cli,fast]" \
    && bash scripts/install-local-model.sh
CMD ["debatebus", "worker", "debatebus._demo:app"]
