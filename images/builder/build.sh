#!/bin/sh
# The image builder's one entry (agentvm/builder:bookworm): loads our Debian bases, builds a tenant's Containerfile with
# buildah and writes the result as an OCI archive. It runs inside the builder agent's VM, called by the gateway through
# the exec path (images/vm-build/); nothing of a tenant's build runs on a host.
#
#   build.sh has-base <key>                           exit 0 when the base of that key is loaded
#   build.sh load-base <key> <oci-archive> <name>...   loads a base archive under its names, then deletes the archive
#   build.sh prepare <job-dir>                         makes the job's context directory (the context is untarred into it)
#   build.sh build <job-dir> <containerfile> <epoch>   builds <job-dir>/context; writes <job-dir>/out.tar
#   build.sh clean <job-dir>                           removes the job's files
#
# Storage is vfs on the agent's own disk (it lasts across sleeps, so a base is loaded once per builder); RUN steps use
# chroot isolation inside this VM and its network, the agent's egress (http_proxy, passed to RUN by buildah).
set -eu
state=/var/lib/agentvm-build
export BUILDAH_ISOLATION=chroot LC_ALL=C TMPDIR="$state/tmp"
mkdir -p "$state/bases" "$state/tmp" /run/agentvm-build
b() { buildah --storage-driver vfs --root "$state/storage" --runroot /run/agentvm-build "$@"; }
in_jobs() { case "$1" in "$state"/jobs/[!./]*) ;; *) echo "not a job directory: $1" >&2; exit 2 ;; esac; }
key_ok() { case "$1" in *[!0-9a-f]* | '') echo "bad base key: $1" >&2; exit 2 ;; esac; }

case "${1:-}" in
  has-base)
    key_ok "$2"
    test -f "$state/bases/$2"
    ;;
  load-base)
    key_ok "$2"
    key=$2 archive=$3
    shift 3
    exec 9>"$state/lock" && flock 9
    id=$(b pull --quiet "oci-archive:$archive")
    b tag "$id" "$@"
    rm -f "$archive"
    touch "$state/bases/$key"
    b rmi --prune >/dev/null 2>&1 || true # the image these names pointed to before (an older base)
    ;;
  prepare)
    in_jobs "$2"
    rm -rf "$2"
    mkdir -p "$2/context"
    ;;
  build)
    job=$2 file=$3 epoch=$4
    tag=localhost/agentvm-build/job:latest
    # One build at a time in a builder (two gateways may send the tenant's builds at once), so what a build killed
    # half-way left can go: its working containers and its result (vfs keeps whole copies of each); the files of a
    # job whose caller died, a day later (another job's context may be waiting for this lock).
    exec 9>"$state/lock" && flock 9
    b rm --all >/dev/null 2>&1 || true
    b rmi "$tag" >/dev/null 2>&1 || true
    find "$state/jobs" -mindepth 1 -maxdepth 1 -mmin +1440 -exec rm -rf {} + 2>/dev/null || true
    b bud --isolation chroot --format oci --pull=false --layers=false --force-rm --timestamp "$epoch" \
      --retry 1 --retry-delay 1s -f "$job/context/$file" -t "$tag" --iidfile "$job/iid" "$job/context"
    echo "agentvm: exporting the image (buildah push oci-archive)"
    b push --disable-compression --quiet "$tag" "oci-archive:$job/out.tar"
    b rmi "$tag" >/dev/null
    ;;
  clean)
    in_jobs "$2"
    rm -rf "$2"
    ;;
  *)
    echo "usage: build.sh has-base|load-base|build|clean ..." >&2
    exit 2
    ;;
esac
