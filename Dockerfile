# collector: rollout collection with Ray workers; the default command runs the demo sweep
# against the built-in simulated provider (no key, no network) and prints the truncation table.
#
#   docker build -t collector .
#   docker run --rm --shm-size=1g -v "$PWD/runs:/data" collector
#   docker run --rm --shm-size=1g -v "$PWD/runs:/data" -e OPENAI_API_KEY collector \
#       run /app/configs/openai_chat.toml --set output.path=/data/openai-chat
#
# Ray keeps its object store in /dev/shm: give the container at least 1 GB (--shm-size).
# On a Ray cluster, use this image for every node (same Python, same collector version) and
# run the driver with `--address` or RAY_ADDRESS; see the README's cluster section.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first, in a layer of their own: it is rebuilt only when pyproject.toml
# changes, so a code change does not reinstall Ray and pyarrow.
COPY pyproject.toml ./
# The mcp extra too, so configs/mcp_demo.toml runs in the image, and the cluster extra: the
# image is meant for every node of a cluster, started with `ray start`.
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['mcp'] + p['optional-dependencies']['cluster']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# Then the package, its metadata and the shipped configs (.dockerignore keeps .venv, runs/
# and caches out of the build context).
COPY README.md ./
COPY collector ./collector
COPY configs ./configs
COPY notebooks ./notebooks
COPY examples ./examples

RUN pip install --no-deps . \
    && useradd --create-home --uid 1000 collector \
    && mkdir -p /data \
    && chown collector:collector /data

USER 1000:1000
VOLUME ["/data"]

ENTRYPOINT ["collector"]
CMD ["run", "/app/configs/demo.toml", "--set", "output.path=/data/demo"]
