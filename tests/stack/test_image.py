"""The stallwatch image as a release ships it: OCI labels, a non-root user, a health check."""

from __future__ import annotations

import json
import re

from .images import StackImages, package_version
from .podman import Podman

OCI = "org.opencontainers.image."


def inspect(podman: Podman, reference: str) -> dict[str, object]:
    (image,) = json.loads(podman.run("image", "inspect", reference))
    assert isinstance(image, dict)
    return image


def test_the_image_carries_its_oci_labels(podman: Podman, images: StackImages) -> None:
    """The image's labels say its version (the package's), commit, licence and title."""
    config = inspect(podman, images.stallwatch.reference)["Config"]
    assert isinstance(config, dict)
    labels = config["Labels"]
    assert labels[OCI + "version"] == package_version()
    assert re.fullmatch(r"[0-9a-f]{40}|unknown", labels[OCI + "revision"])
    assert labels[OCI + "licenses"] == "Apache-2.0"
    assert labels[OCI + "title"] == "stallwatch"
    assert OCI + "source" in labels


def test_the_image_runs_as_a_non_root_user_with_a_health_check(
    podman: Podman, images: StackImages
) -> None:
    """The image's user is 10001, a container started from it is not root and runs stallwatch;
    the health check asks the component's own health endpoint."""
    image = inspect(podman, images.stallwatch.reference)
    config = image["Config"]
    assert isinstance(config, dict)
    assert config["User"] == "10001:10001"
    # Kept in Docker's format only (podman puts it beside Config in its inspect output).
    assert image["ManifestType"] == "application/vnd.docker.distribution.manifest.v2+json"
    health = image["Healthcheck"]
    assert isinstance(health, dict)
    assert "STALLWATCH_HEALTHCHECK_URL" in " ".join(health["Test"])
    identity = podman.run(
        "run", "--rm", "--network", "none", "--entrypoint", "id",
        images.stallwatch.reference, "-u",
    )  # fmt: skip
    assert identity.strip() == "10001"
    version = podman.run(
        "run", "--rm", "--network", "none", images.stallwatch.reference, "--version"
    )
    assert package_version() in version
