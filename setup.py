"""Package mapping: the top-level folders planner/ and messenger/ (kept apart by the design's
dependency rule) are installed as sparkgnn.planner and sparkgnn.messenger."""

from setuptools import find_packages, setup


def _mapped(prefix: str, folder: str) -> tuple[list[str], dict[str, str]]:
    subpackages = find_packages(folder)
    names = [prefix] + [f"{prefix}.{name}" for name in subpackages]
    dirs = {prefix: folder}
    dirs.update({f"{prefix}.{name}": f"{folder}/{name.replace('.', '/')}" for name in subpackages})
    return names, dirs


packages = find_packages("python")
package_dir = {"": "python"}
for prefix, folder in (("sparkgnn.planner", "planner"), ("sparkgnn.messenger", "messenger")):
    names, dirs = _mapped(prefix, folder)
    packages += names
    package_dir.update(dirs)

setup(packages=packages, package_dir=package_dir)
