"""The SDK natively: `python3 -m unittest` in plugins/python."""

import unittest

from heddle_plugin import Detection, Facts, Info, PluginError, export, log, run

FACTS = {
    "host": {"hostname": "n1", "dmi": {"sys_vendor": "ACME"}},
    "gpus": [{"index": 0, "numa_node": 0, "memory_total_bytes": 85899345920}],
    "rdma": {"devices": {"mlx5_0": {"ports": [{"port": 1, "state": "ACTIVE"}]}}},
    "a/b": {"~c": True},
    "ratio": 1.5,
}


class FactsTest(unittest.TestCase):
    def test_typed_lookups_by_json_pointer(self):
        f = Facts(FACTS)
        self.assertEqual(f.str_at("/host/dmi/sys_vendor"), "ACME")
        self.assertEqual(f.int_at("/gpus/0/memory_total_bytes"), 85899345920)
        self.assertEqual(f.float_at("/ratio"), 1.5)
        self.assertEqual(f.float_at("/gpus/0/numa_node"), 0.0)
        self.assertIs(f.bool_at("/a~1b/~0c"), True)
        self.assertIsNone(f.str_at("/host/missing"))
        self.assertIsNone(f.get("/gpus/7"))
        self.assertEqual(f.list_at("/nothing"), [])
        self.assertIs(f.get(""), f.root)

    def test_wrong_types_are_bad_facts(self):
        f = Facts(FACTS)
        for lookup in (lambda: f.str_at("/gpus"), lambda: f.int_at("/a~1b/~0c"),
                       lambda: f.list_at("/host"), lambda: f.bool_at("/ratio")):
            with self.assertRaises(PluginError) as e:
                lookup()
            self.assertEqual(e.exception.code, "bad-facts")

    def test_entries_read_lists_and_maps_alike(self):
        f = Facts(FACTS)
        self.assertEqual([k for k, _ in f.entries("/rdma/devices")], ["mlx5_0"])
        self.assertEqual([i for i, _ in f.entries("/gpus")], [0])
        self.assertEqual(list(f.entries("/host/hostname")), [])

    def test_parse_refuses_what_is_not_an_object(self):
        for text in ("[1]", "{not json"):
            with self.assertRaises(PluginError):
                Facts.parse(text)


class Plugin:
    @staticmethod
    def info():
        return Info("t", "1", "test", reads=["/host"])

    @staticmethod
    def detect(facts):
        d = Detection()
        if facts.str_at("/host/dmi/sys_vendor") != "ACME":
            return d
        log.info("acme")
        return (d.add_trait("vendor", "acme")
                 .recommend("NCCL_IB_HCA", "mlx5_0", "the only HCA")
                 .add_affinity(0, "0-7", numa=0, nic="mlx5_0")
                 .expect("rdma.ib_write_bw", "bw_gbs", 11.25, "datasheet")
                 .warn("check me"))


class RunTest(unittest.TestCase):
    def test_run_natively_from_text_or_dict(self):
        d = run(Plugin, '{"host": {"dmi": {"sys_vendor": "ACME"}}}')
        self.assertEqual(d.trait_value("vendor"), "acme")
        self.assertEqual(d.env_value("NCCL_IB_HCA"), "mlx5_0")
        self.assertEqual(d.affinity[0].numa, 0)
        self.assertEqual(d.expectations[0].value, 11.25)
        self.assertIn(("info", "acme"), log.records)
        self.assertTrue(run(Plugin, {}).is_empty())

    def test_export_is_the_class_itself_outside_a_component(self):
        self.assertIs(export(Plugin), Plugin)


if __name__ == "__main__":
    unittest.main()
