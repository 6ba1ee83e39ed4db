# The Heddle node agent, with what its tests load at run time:
#   - NCCL (libnccl.so.2 from NVIDIA's nvidia-nccl-cu12 wheel, the version build-images.sh
#     pins, in /opt/nccl/lib on the loader's path; HEDDLE_NCCL_LIBRARY picks another);
#   - the user-space RDMA stack (rdma-core: libibverbs, librdmacm and the mlx5/efa/...
#     providers), perftest (ib_write_bw, ...) and UCX (ucx_perftest).
# The NVIDIA container runtime adds the driver's libraries (libcuda, libnvidia-ml) from the
# host; it adds no CUDA library, hence NCCL here. Run flags: docker/README.md, e.g.
#
#   docker run -d --name heddle-agent --restart unless-stopped \
#     --net=host --ipc=host --runtime=nvidia --gpus all \
#     --device=/dev/infiniband --cap-add=IPC_LOCK --ulimit memlock=-1 \
#     -v /sys:/sys:ro -v /etc:/host/etc:ro -v /var/lib/heddle-agent:/var/lib/heddle-agent \
#     -e HEDDLE_SERVER=http://heddle:8080 -e HEDDLE_ENROLL_TOKEN=hde_... heddle-agent:dev
# build-images.sh passes the base: debian:bookworm-slim by digest, or a local debootstrap.
ARG BASE_IMAGE=debian:bookworm-slim@sha256:abd67ffcfa541b485a3dff59865ab629aa048a6c613e639d36e7456b0b229241
FROM ${BASE_IMAGE}
RUN apt-get update -q \
 && apt-get install -y -q --no-install-recommends \
      ca-certificates tini iproute2 pciutils libstdc++6 \
      rdma-core libibverbs1 librdmacm1 ibverbs-providers ibverbs-utils perftest ucx-utils \
      libfaketime \
 && rm -rf /var/lib/apt/lists/*
# A layer of its own before the binary, so a new agent does not copy NCCL again.
COPY nccl /opt/nccl
RUN ln -s libnccl.so.2 /opt/nccl/lib/libnccl.so \
 && echo /opt/nccl/lib >/etc/ld.so.conf.d/nccl.conf \
 && ldconfig
COPY heddle-agent /usr/local/bin/heddle-agent
ENV HEDDLE_STATE_DIR=/var/lib/heddle-agent \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
VOLUME /var/lib/heddle-agent
# Root: registering RDMA memory and reading every sysfs attribute need it (with IPC_LOCK).
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/heddle-agent"]
CMD ["run"]
