use super::super::ibnetdiscover;
use crate::fabric::Tier;

/// Real captures; where each was published is in tests/fixtures/fabric/README.md.
const MANUAL: &str =
    include_str!("../../../tests/fixtures/fabric/ibnetdiscover-rdma-core-manual.txt");
const OMPI: &str = include_str!("../../../tests/fixtures/fabric/ibnetdiscover-ompi-users-2009.txt");

#[test]
fn the_manual_example_reads_with_its_disagreements() {
    let f = ibnetdiscover(MANUAL).unwrap();
    assert_eq!(f.switches.len(), 2);
    assert!(f.switches.iter().all(|s| s.tier == Tier::Leaf));
    assert_eq!(f.switches[0].name, "S-005442ba00003080");
    assert_eq!(f.switches[0].guid.as_deref(), Some("0x005442ba00003080"));
    // Two cables between the switches, each printed from both ends: two links.
    assert_eq!(f.links.len(), 2, "{:#?}", f.links);
    assert_eq!(f.links[0].gbps, Some(8.0));
    // Four CAs; the default descriptions name no host.
    assert_eq!(f.nodes.len(), 4);
    let two = f
        .nodes
        .iter()
        .find(|n| n.name == "H-0008f10403960558")
        .unwrap();
    assert_eq!(two.nics.len(), 2);
    let p1 = two.nics.iter().find(|n| n.name == "hca-1").unwrap();
    assert_eq!(p1.leaf.as_deref(), Some("S-005442ba00003080"));
    assert_eq!(p1.port, Some(12));
    assert_eq!(p1.guid.as_deref(), Some("0x0008f10403960559"));
    assert_eq!(p1.gbps, Some(2.0), "the CA's own end says 1xSDR");
    let notes = |s: &str| {
        f.notes
            .iter()
            .filter(|n| n.subject == s)
            .map(|n| n.message.clone())
            .collect::<Vec<_>>()
    };
    let n558 = notes("H-0008f10403960558");
    assert!(n558.iter().any(|m| m.contains("names no host")), "{n558:?}");
    assert!(
        n558.iter()
            .any(|m| m.contains("the CA's end says 1xSDR, the switch's end 4xSDR")),
        "{n558:?}"
    );
    assert!(
        n558.iter().any(|m| m.starts_with("rails unmapped")),
        "{n558:?}"
    );
    let sw = notes("S-0008f10400410015");
    assert!(
        sw.iter()
            .any(|m| m.contains("one end says 4xSDR, the other 1xSDR")),
        "{:#?}",
        f.notes
    );
}

#[test]
fn the_ompi_capture_maps_every_host() {
    let f = ibnetdiscover(OMPI).unwrap();
    assert_eq!(f.switches.len(), 1);
    assert_eq!(f.switches[0].tier, Tier::Leaf);
    assert_eq!(f.nodes.len(), 24);
    let n = f.nodes.iter().find(|n| n.name == "node13").unwrap();
    assert_eq!(n.nics.len(), 1);
    let nic = &n.nics[0];
    assert_eq!(
        (nic.name.as_str(), nic.rail, nic.port),
        ("HCA-1", Some(0), Some(13))
    );
    assert_eq!(nic.leaf.as_deref(), Some("S-000b8cffff002347"));
    // The capture prints no widths or speeds: no rate rather than a guessed one.
    assert_eq!(nic.gbps, None);
    assert!(f.notes.is_empty(), "{:#?}", f.notes);
}

#[test]
fn modern_descriptions_name_hosts_nics_and_switches() {
    let text = "switchguid=0xb8cef60300e5d2a0(b8cef60300e5d2a0)\n\
Switch\t40 \"S-b8cef60300e5d2a0\"\t\t# \"MF0;leaf-1:MQM8790/U1\" enhanced port 0 lid 1 lmc 0\n\
[1]\t\"H-0c42a10300a1b2c4\"[1](c42a10300a1b2c5) \t\t# \"gpu-01 mlx5_0\" lid 5 4xHDR\n\
[21]\t\"S-b8cef60300e5d2b0\"[1]\t\t# \"MF0;spine-1:MQM8790/U1\" lid 2 4xHDR\n\
\n\
Switch\t40 \"S-b8cef60300e5d2b0\"\t\t# \"MF0;spine-1:MQM8790/U1\" enhanced port 0 lid 2 lmc 0\n\
[1]\t\"S-b8cef60300e5d2a0\"[21]\t\t# \"MF0;leaf-1:MQM8790/U1\" lid 1 4xHDR\n\
\n\
caguid=0xc42a10300a1b2c4\n\
Ca\t1 \"H-0c42a10300a1b2c4\"\t\t# \"gpu-01 mlx5_0\"\n\
[1](c42a10300a1b2c5) \t\"S-b8cef60300e5d2a0\"[1]\t\t# lid 5 lmc 0 \"MF0;leaf-1:MQM8790/U1\" lid 1 4xHDR\n";
    let f = ibnetdiscover(text).unwrap();
    let names: Vec<_> = f
        .switches
        .iter()
        .map(|s| (s.name.as_str(), s.tier))
        .collect();
    assert_eq!(names, [("leaf-1", Tier::Leaf), ("spine-1", Tier::Spine)]);
    assert_eq!(f.links.len(), 1);
    assert_eq!(f.links[0].gbps, Some(200.0));
    assert_eq!(f.nodes[0].name, "gpu-01");
    assert_eq!(f.nodes[0].nics[0].name, "mlx5_0");
    assert_eq!(f.nodes[0].nics[0].gbps, Some(200.0));
}

#[test]
fn every_bad_line_is_named() {
    let text = "[1] \"S-01\"[2]\nSwitch x \"S-01\"\nSwitch 8 S-01\nSwitch 8 \"Q-01\"\nSwitch 8 \"S-zz\"\nCa 2 \"H-02\" # \"h nic\"\n[a] \"S-01\"[1]\n[1] S-01[1]\n[2](xyz) \"S-01\"[1]\n[3] \"S-01\"[1\nbogus\nCa 2 \"H-02\"\n";
    let errs = ibnetdiscover(text).unwrap_err().0;
    let want = [
        "line 1: a port line before any Switch",
        "line 2: no port count",
        "line 3: the node id is not quoted",
        "line 4: \"Q-01\" is not S-, H- or R-",
        "line 5: \"S-zz\" is not",
        "line 7: [port] is not a number",
        "line 8: no quoted peer",
        "line 9: the port GUID is not hexadecimal",
        "line 10: [port] is not closed",
        "line 11: not a line of an ibnetdiscover",
        "line 12: H-02 was listed on line 6 already",
    ];
    for w in want {
        assert!(errs.iter().any(|e| e.starts_with(w)), "{w}\n{errs:#?}");
    }
    assert_eq!(errs.len(), want.len(), "{errs:#?}");
    let dangling = "Ca 1 \"H-02\" # \"h nic\"\n[1] \"S-01\"[1]\n";
    assert!(ibnetdiscover(dangling).unwrap_err().0[0].contains("S-01 is not listed"));
}

#[test]
fn hostile_input_is_bounded() {
    let long = format!("# {}\n", "x".repeat(70_000));
    assert!(ibnetdiscover(&long).unwrap_err().0[0].contains("longer than"));
    assert!(ibnetdiscover("Switch 99999 \"S-01\"\n").unwrap_err().0[0].contains("ports is not"));
    let mut many = String::from("Switch 8 \"S-01\"\n");
    for _ in 0..3 {
        many.push_str("[1] \"H-02\"[1]\n");
    }
    assert!(ibnetdiscover(&many).unwrap_err().0[0].contains("listed twice"));
}
