"""Installs the npusim package into this Python environment in develop mode.

    python adapter/tf/python/install_dev.py BUILD/libnpusim_tf_plugin.so

- <site-packages>/npusim.pth puts adapter/tf/python on sys.path, so `import npusim` uses the
  repository's files (edits take effect at once, as with `pip install -e`);
- <site-packages>/npusim_plugin/libnpusim_tf_plugin.so links to the built plugin, where
  `import npusim` looks for it (NPUSIM_TF_PLUGIN overrides).
The plugin is deliberately not put into site-packages/tensorflow-plugins/: TensorFlow would
then load it in every process, and the NPU would appear (and change Keras' defaults) for code
that never imported npusim. Idempotent.
"""

import os
import sys
import sysconfig

PLUGIN_FILE = "libnpusim_tf_plugin.so"


def main(argv):
    if len(argv) != 2:
        sys.exit(f"usage: {argv[0]} PATH/TO/{PLUGIN_FILE}")
    plugin = os.path.realpath(argv[1])
    if not os.path.isfile(plugin):
        sys.exit(f"install_dev: {plugin}: no such file")
    site_dir = sysconfig.get_path("purelib")
    package_root = os.path.dirname(os.path.realpath(__file__))

    with open(os.path.join(site_dir, "npusim.pth"), "w", encoding="utf-8") as f:
        f.write(package_root + "\n")

    plugin_dir = os.path.join(site_dir, "npusim_plugin")
    os.makedirs(plugin_dir, exist_ok=True)
    link = os.path.join(plugin_dir, PLUGIN_FILE)
    if os.path.islink(link) or os.path.exists(link):
        os.remove(link)
    os.symlink(plugin, link)
    print(f"install_dev: npusim -> {package_root}; {link} -> {plugin}")


if __name__ == "__main__":
    main(sys.argv)
