"""Template detector in Python: recommends the interface NCCL should use for its bootstrap
and socket traffic, the first Ethernet interface that is up and not enslaved to a bond,
physical ones first. Replace the logic, keep the shape.

Test:  python3 -m unittest             (natively, no WebAssembly needed)
Build: ./build.sh                      (componentize-py from PyPI -> template-python.wasm)
Try:   heddle-agent detect --plugin template-python.wasm --root <fixture tree>
"""

from heddle_plugin import Detection, Facts, Info, export, log


class SocketIfname:
    @staticmethod
    def info() -> Info:
        return Info(
            name="my-python-plugin",
            version="0.1.0",
            description="Recommends NCCL_SOCKET_IFNAME: the first Ethernet interface that is up and not in a bond, physical ones first",
            # Only these fields of every interface reach the plugin.
            reads=[
                "/network/interfaces/*/name",
                "/network/interfaces/*/kind",
                "/network/interfaces/*/operstate",
                "/network/interfaces/*/master",
                "/network/interfaces/*/virtual_device",
            ],
        )

    @staticmethod
    def detect(facts: Facts) -> Detection:
        d = Detection()
        up = [
            iface
            for iface in facts.list_at("/network/interfaces")
            if iface.get("kind") == "ethernet"
            and iface.get("operstate") == "up"
            and not iface.get("master")  # a bond's member: the bond is the interface
        ]
        # Physical first; sorted() keeps the agent's order otherwise.
        candidates = [i["name"] for i in sorted(up, key=lambda i: bool(i.get("virtual_device")))]
        if not candidates:
            return d  # Not applicable: an empty detection, not an error.
        log.debug(f"Ethernet candidates: {candidates}")
        d.add_trait("my.socket_ifname", candidates[0])
        d.recommend(
            "NCCL_SOCKET_IFNAME",
            candidates[0],
            f"{candidates[0]} is the first Ethernet interface that is up and not in a bond",
        )
        physical = [i["name"] for i in up if not i.get("virtual_device")]
        if len(physical) > 1:
            d.warn(f"several physical candidates ({', '.join(physical)}); picked the first")
        return d


# componentize-py exports the class named `Plugin` of the app module.
Plugin = export(SocketIfname)
