#!/bin/bash
# The node tier's stand-in for the NVIDIA container toolkit's runtime (test configuration,
# not a production code path): containerd runs this instead of runc. On `create` it edits
# the OCI bundle as nvidia-container-runtime does for a container whose environment asks for
# GPUs (NVIDIA_VISIBLE_DEVICES set, not `void`/`none`): the driver's user-space libraries
# are bind-mounted read-only where the toolkit puts them. Here the "driver" is fracgpu's
# fake libcuda/libnvidia-ml (shim/testdoubles); the fake GPUs' shared state directory and
# its configuration (FRACGPU_FAKE_GPU_CONFIG) come with them, standing in for /dev/nvidia*.
# Everything else goes to runc unchanged. @PLACEHOLDERS@ are filled in by runtime.py.
set -euo pipefail
RUNC=@RUNC@
DRIVER_DIR=@DRIVER_DIR@
FAKE_GPU_DIR=@FAKE_GPU_DIR@
FAKE_GPU_CONFIG=@FAKE_GPU_CONFIG@
LOG=@LOG@
LIBDIR=/usr/lib/x86_64-linux-gnu

create=0
bundle=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    create) create=1 ;;
    --bundle | -b) bundle="${args[$((i + 1))]:-}" ;;
    --bundle=*) bundle="${args[$i]#--bundle=}" ;;
  esac
done

if [[ $create == 1 && -n "$bundle" && -f "$bundle/config.json" ]]; then
  config="$bundle/config.json"
  visible=$(jq -r '[.process.env[]? | select(startswith("NVIDIA_VISIBLE_DEVICES="))]
                   | last // "" | sub("^NVIDIA_VISIBLE_DEVICES="; "")' "$config")
  case "$visible" in
    "" | void | none)
      echo "$(date +%T) ${args[-1]}: NVIDIA_VISIBLE_DEVICES='$visible': no driver" >>"$LOG"
      ;;
    *)
      jq --arg libdir "$LIBDIR" --arg driver "$DRIVER_DIR" --arg gpus "$FAKE_GPU_DIR" \
        --arg conf "$FAKE_GPU_CONFIG" '
        .mounts += [
          {destination: ($libdir + "/libcuda.so.1"), type: "bind",
           source: ($driver + "/libcuda.so.1"), options: ["rbind", "ro", "nosuid", "nodev"]},
          {destination: ($libdir + "/libnvidia-ml.so.1"), type: "bind",
           source: ($driver + "/libnvidia-ml.so.1"), options: ["rbind", "ro", "nosuid", "nodev"]},
          {destination: $gpus, type: "bind", source: $gpus,
           options: ["rbind", "rw", "nosuid", "nodev"]}
        ]
        | .process.env += ["FRACGPU_FAKE_GPU_CONFIG=" + $conf]' "$config" >"$config.fracgpu-tmp"
      mv -f "$config.fracgpu-tmp" "$config"
      echo "$(date +%T) ${args[-1]}: NVIDIA_VISIBLE_DEVICES='$visible': driver mounted" >>"$LOG"
      ;;
  esac
fi
exec "$RUNC" "$@"
