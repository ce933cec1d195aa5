"""The NVIDIA container toolkit installer as a node agent: `gpu-operator agent container-toolkit`.

Drop-in for upstream's `nvidia-ctk-installer` (the toolkit DaemonSet's main container) with its
environment contract: installs the NVIDIA runtime's config under ROOT, writes the management CDI
spec from NVML, adds the `nvidia`, `nvidia-cdi` and `nvidia-legacy` handlers to containerd, CRI-O or
Docker, restarts the runtime, and on SIGTERM reverts. Better than upstream: the node's original
runtime config is saved before the first edit and restored byte for byte on uninstall, sections we
do not own are never touched, and changes made behind our back are noticed and re-applied with a
Warning Event. Modules: `tomltext` (TOML as text), `containerd`/`crio`/`docker` (pure editors),
`backup`/`configure` (original config and restore), `restart` (signal/systemd/none), `install`
(toolkit files, pid lock), `cdi_spec` (management spec), `settings`/`runner`/`cli` (wiring).
See docs/node-chain.md, section "The container toolkit".
"""
