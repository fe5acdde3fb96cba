"""The host: driver and CUDA lanes, boot/IOMMU, passthrough, NCCL env, GPU facts, host data."""
