# image.nix -- the OCI image of xmsg, for containers: the leaf beside an agent in a pod
# (deploy/kubernetes/leaf-pod.json), or any bus where systemd is missing.
#
# Built with dockerTools.buildLayeredImage: the binary's store closure and nothing else (no
# shell, no package manager, no /etc), so there is nothing in the image to escalate with.
# It runs as a fixed numeric non-root user (a Kubernetes `runAsNonRoot` check needs a number
# to verify) and writes only to two volumes, so the root filesystem can be read-only:
#   /run/xmsg      XDG_RUNTIME_DIR: the daemon makes /run/xmsg/xmsg (0700) for its sockets;
#                  the one volume a bot container shares with it
#   /var/lib/xmsg  XDG_STATE_HOME: the store, /var/lib/xmsg/xmsg/xmsg.db
# Both exist in the image, owned by that user with mode 0700, so that a runtime without
# volumes there (docker run --read-only --tmpfs ...) still finds them.
#
#   nix build .#image && docker image load -i result
{
  lib,
  dockerTools,
  xmsg,
}:
let
  # The "nonroot" uid/gid of distroless images: no account of the host or of a base image.
  uid = 65532;
  gid = 65532;
  runtimeDir = "/run/xmsg";
  stateDir = "/var/lib/xmsg";
in
dockerTools.buildLayeredImage {
  name = "xmsg";
  tag = xmsg.version;

  # The mount points, created inside fakeroot so that they can belong to the user; and
  # /bin/xmsg, the path a kubelet's exec probe names (`xmsg health`: the image has no shell
  # and no PATH of its own).
  fakeRootCommands = ''
    mkdir -p ./bin
    ln -s ${lib.getExe xmsg} ./bin/xmsg
    mkdir -p .${runtimeDir} .${stateDir}
    chown ${toString uid}:${toString gid} .${runtimeDir} .${stateDir}
    chmod 0700 .${runtimeDir} .${stateDir}
  '';

  config = {
    Entrypoint = [ (lib.getExe xmsg) ];
    User = "${toString uid}:${toString gid}";
    Env = [
      "XDG_RUNTIME_DIR=${runtimeDir}"
      "XDG_STATE_HOME=${stateDir}"
    ];
    Volumes = {
      ${runtimeDir} = { };
      ${stateDir} = { };
    };
    Labels = {
      "org.opencontainers.image.title" = "xmsg";
      "org.opencontainers.image.description" = xmsg.meta.description or "xmsg";
      "org.opencontainers.image.version" = xmsg.version;
    };
  };

  passthru = {
    inherit uid gid runtimeDir stateDir;
  };
}
