#!/usr/bin/env bash
# The container image's name (the Dockerfile at the checkout's root): REGISTRY/clustergate:VERSION, where
# VERSION is this checkout's clustergate version (pyproject.toml), so the image and the checkout that launches it
# are one version. REGISTRY is where the site pushes it, e.g. ghcr.io/OWNER. One rule for the README's build and
# push commands, launch/k8s/render.sh (CG_REGISTRY) and launch/slurm/job.sh (CLUSTERGATE_REGISTRY):
#
#   launch/image.sh ghcr.io/OWNER            prints ghcr.io/OWNER/clustergate:VERSION
#   launch/image.sh --enroot ghcr.io/OWNER   prints ghcr.io#OWNER/clustergate:VERSION, as pyxis/enroot take it
#
# Sourced, it defines clustergate_image REGISTRY [NAME] and clustergate_enroot_image REGISTRY [NAME] (printing the
# same); a registry that is not a plain registry path ends the calling script: exit 2, one line naming NAME (the
# variable it came from).

# The checkout's pyproject.toml: its [project] version.
clustergate_version() {
    local root
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    sed -n 's/^version = "\([^"]*\)"$/\1/p' "$root/pyproject.toml" | head -n1
}

# A registry path as Docker takes it: a host (with an optional port) and optional path, e.g. ghcr.io/OWNER,
# registry.example:5000/team, or a Docker Hub account alone.
_clustergate_registry() {
    [[ $1 =~ ^[a-z0-9]([a-z0-9._-]*[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9]([a-z0-9._-]*[a-z0-9])?)*$ ]] && return 0
    echo "${2:-registry}=${1@Q} is not a registry path such as ghcr.io/owner (lower case; no scheme, no tag)" >&2
    exit 2
}

clustergate_image() {
    _clustergate_registry "$@"
    printf '%s/clustergate:%s\n' "$1" "$(clustergate_version)"
}

# enroot's form: the registry's host, then '#', then the path; a Docker Hub account has no host part (Docker's
# rule: the first part is a host when it holds a '.' or a ':' or is localhost).
clustergate_enroot_image() {
    _clustergate_registry "$@"
    local first=${1%%/*} rest=
    [[ $1 == */* ]] && rest=${1#*/}/
    if [[ $first == *.* || $first == *:* || $first == localhost ]]; then
        printf '%s#%sclustergate:%s\n' "$first" "$rest" "$(clustergate_version)"
    else
        printf '%s/clustergate:%s\n' "$1" "$(clustergate_version)"
    fi
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    set -euo pipefail
    case ${1:-} in
        --enroot) (($# == 2)) && clustergate_enroot_image "$2" && exit 0 ;;
        -*) ;;
        ?*) (($# == 1)) && clustergate_image "$1" && exit 0 ;;
    esac
    echo "usage: launch/image.sh [--enroot] REGISTRY   (e.g. ghcr.io/OWNER)" >&2
    exit 2
fi
