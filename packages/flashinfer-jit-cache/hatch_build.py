"""Version from the monorepo's version.txt; the core package is pinned to exactly it.
(The build hook that fills this wheel comes with its own issue.)"""

from pathlib import Path

from hatchling.metadata.plugin.interface import MetadataHookInterface


class CustomMetadataHook(MetadataHookInterface):
    def update(self, metadata: dict) -> None:
        root = Path(self.root)
        for candidate in (root / "version.txt", root.parent.parent / "version.txt"):
            if candidate.is_file():
                version = candidate.read_text().strip()
                break
        else:
            raise FileNotFoundError(f"version.txt not found for {root}")
        metadata["version"] = version
        metadata["dependencies"] = [f"flashinfer-python=={version}"]
