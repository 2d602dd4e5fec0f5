# The compose test's simnpu:multihost: the simnpu image with torch's CPU build, installed
# from a wheel in the build context (run_compose_test.sh downloads it on the host with pip,
# from its configured sources or PyTorch's index). Users build the same image with
# `docker build --build-arg SIMNPU_EXTRAS=multihost .` instead (docs/containers.md).
FROM simnpu
USER root
COPY torch-*.whl /tmp/
RUN pip install /tmp/torch-*.whl && rm /tmp/torch-*.whl \
 && python -c "import torch.distributed as d; assert d.is_gloo_available()"
USER simnpu
