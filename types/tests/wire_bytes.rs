//! The exact bytes of a job spec and of a result upload, for every kind.
//!
//! Servers and agents of different versions talk to each other, and stored runs are read
//! back by newer servers: how a spec or a result is written must not change when the types
//! that carry them do. Each sample is written as today's types write it (a spec as the CLI
//! or the launcher sends it, a result as the agent's runner uploads it); decoding it and
//! encoding it again must give the same bytes.

use heddle_types::jobs::{JobSpec, ResultUpload};
use heddle_types::kinds::SpecParamsError;

/// A job spec per kind: params as their creator gave them (partly, wholly or not at all).
const SPECS: &[(&str, &str)] = &[
    (
        "nccl",
        r#"{"kind":"nccl","params":{"gpus":8,"max_bytes":8589934592,"op":"all_reduce"},"env":{"NCCL_IB_HCA":"mlx5_0,mlx5_1"},"timeout_s":600}"#,
    ),
    (
        "nccl",
        r#"{"kind":"nccl","params":{"budget":"10s","check":false,"dtype":"bfloat16","factor":4,"gpus":2,"graph":0,"iters":50,"max_bytes":134217728,"min_bytes":1024,"op":"reduce_scatter","redop":"max","root":0,"warmup":10},"env":{},"timeout_s":null,"stall_s":120}"#,
    ),
    (
        "sweep",
        r#"{"kind":"sweep","params":{"grid":{"NCCL_ALGO":["Ring","Tree"],"NCCL_PROTO":["LL",128]},"max_bytes":1048576,"op":"all_gather"},"env":{},"timeout_s":1800}"#,
    ),
    (
        "rdma_ab",
        r#"{"kind":"rdma_ab","params":{"gpus":8,"max_bytes":134217728,"op":"all_reduce"},"env":{},"timeout_s":900}"#,
    ),
    (
        "p2p",
        r#"{"kind":"p2p","params":{"bidirectional":true,"gpus":[0,1,2,3],"iters":20,"size":268435456},"env":{},"timeout_s":null}"#,
    ),
    (
        "rdma",
        r#"{"kind":"rdma","params":{"all":false,"device":"mlx5_0","gid_index":3,"size":65536,"test":"ib_write_lat"},"env":{},"timeout_s":300}"#,
    ),
    (
        "ucx",
        r#"{"kind":"ucx","params":{"memory":"cuda","sizes":[8,65536],"tests":["tag_lat","tag_bw"]},"env":{"UCX_TLS":"rc,cuda_copy"},"timeout_s":null}"#,
    ),
    (
        "memcpy",
        r#"{"kind":"memcpy","params":{"factor":4.0,"iters":10,"max_bytes":16777216,"min_bytes":4096},"env":{},"timeout_s":60}"#,
    ),
    (
        "env",
        r#"{"kind":"env","params":null,"env":{"NCCL_DEBUG":"INFO"},"timeout_s":null}"#,
    ),
    (
        "env",
        r#"{"kind":"env","params":{},"env":{},"timeout_s":null}"#,
    ),
    (
        "sleep",
        r#"{"kind":"sleep","params":{"seconds":2.5,"silent_after_s":1},"env":{},"timeout_s":30,"stall_s":5}"#,
    ),
    (
        "fail",
        r#"{"kind":"fail","params":{"exit_code":3,"message":"boom"},"env":{},"timeout_s":null}"#,
    ),
    // A kind this build does not know (a newer server's): still read, so the agent can
    // fail the job with "unsupported" rather than refuse its claim.
    (
        "from-the-future",
        r#"{"kind":"nccl-allreduce-from-the-future","params":{"x":[1,2]},"env":{},"timeout_s":null}"#,
    ),
];

const ROW_NCCL: &str = r#"{"size_bytes":134217728,"count":33554432,"dtype":"float","op":"all_reduce","root":-1,"in_place":false,"time_us":1380.5,"algbw_gbs":97.23,"busbw_gbs":182.3,"wrong":0,"labels":{},"extra":null}"#;

/// A result per kind: the summary each runner writes, and a row where it has rows.
fn uploads() -> Vec<(&'static str, String)> {
    let up = |summary: &str, rows: &str| {
        format!(
            r#"{{"upload_key":"0b7e6f2a-53c5-4d4e-9f61-0c2a4f7e9a10","outcome":"succeeded","reason":null,"exit_code":0,"stderr_tail":null,"summary":{summary},"rows":[{rows}],"started_at":"2026-11-27T10:00:00Z","finished_at":"2026-11-27T10:01:30Z"}}"#
        )
    };
    let nccl_evidence = r#"{"channel_transports":["NET/IB/0/GDRDMA"],"devices":[{"link_layer":"IB","name":"mlx5_0","port":1}],"gdr":true,"network":"IB","network_line":"NCCL INFO Using network IB","oob":"eth0","transports":{"NET/IB":12,"P2P/CUMEM":24},"version":"2.21.5"}"#;
    let nccl_summary = format!(
        r#"{{"avg_busbw_gbs":101.7,"check":true,"collective":"all_reduce","devices":[0,1,2,3,4,5,6,7],"dtype":"float","first_rank":0,"graph":null,"init_s":1.25,"iters":20,"kind":"nccl","local_ranks":8,"nccl_channels":16,"nccl_env":["NCCL_IB_HCA"],"nccl_evidence":{nccl_evidence},"nccl_init_s":0.75,"nccl_network":"IB","nccl_transports":["NET/IB","P2P/CUMEM"],"nccl_version":22105,"nranks":16,"peak_busbw_gbs":182.3,"redop":"sum","sweep_s":12.5,"warmup":5,"wrong":0}}"#
    );
    vec![
        ("nccl", up(&nccl_summary, ROW_NCCL)),
        (
            "sweep",
            up(
                r#"{"cells":[{"avg_busbw_gbs":80.5,"exit_code":0,"labels":{"NCCL_ALGO":"Ring"},"nccl_transports":["P2P/CUMEM"],"peak_busbw_gbs":150.25,"wrong":0},{"exit_code":5,"hung":{"last_size_bytes":4096,"limit_s":30,"silent_s":31.5,"stage":"size 4096 B"},"labels":{"NCCL_ALGO":"Tree"}}],"collective":"all_gather","kind":"sweep"}"#,
                r#"{"size_bytes":1048576,"count":262144,"dtype":"float","op":"all_gather","root":-1,"in_place":false,"time_us":20.5,"algbw_gbs":51.15,"busbw_gbs":150.25,"wrong":0,"labels":{"NCCL_ALGO":"Ring"},"extra":null}"#,
            ),
        ),
        (
            "rdma_ab",
            up(
                &format!(
                    r#"{{"collective":"all_reduce","comparison":{{"bands":[{{"band":"large","ratio":4.2,"size_bytes":134217728}}],"points":[{{"ratio":4.2,"rdma_busbw_gbs":122.3,"size_bytes":134217728,"socket_busbw_gbs":29.1}}]}},"dtype":"float","kind":"rdma_ab","leg_env":{{"rdma":{{}},"socket":{{"NCCL_IB_DISABLE":"1","NCCL_NET":"Socket"}}}},"legs":{{"rdma":{nccl_summary},"socket":{{"kind":"nccl","nccl_evidence":{{"network":"Socket"}},"nranks":16}}}},"nccl_version":22105,"nranks":16,"redop":"sum"}}"#
                ),
                r#"{"size_bytes":134217728,"count":null,"dtype":null,"op":"all_reduce","root":null,"in_place":null,"time_us":null,"algbw_gbs":null,"busbw_gbs":29.1,"wrong":null,"labels":{"leg":"socket"},"extra":null}"#,
            ),
        ),
        (
            "p2p",
            up(
                r#"{"bidirectional":false,"cuda_driver_version":"12.4","d2d_gbs":[[1300.0,370.5],[330.25,1290.0]],"d2d_paths":[["self","NVLink"],["NVLink","self"]],"d2h_gbs":[53.0,49.5],"gpus":[0,1],"h2d_gbs":[52.0,51.0],"iters":20,"kind":"p2p","peer_access":[[true,true],[true,true]],"size_bytes":268435456,"warmup":5,"wrong":0}"#,
                r#"{"size_bytes":268435456,"count":null,"dtype":null,"op":null,"root":null,"in_place":null,"time_us":726.5,"algbw_gbs":370.5,"busbw_gbs":null,"wrong":0,"labels":{"dst":"1","kind":"d2d","mode":"unidir","src":"0"},"extra":null}"#,
            ),
        ),
        (
            "rdma",
            up(
                r#"{"device":"mlx5_0","gid_index":3,"ib_port":1,"kind":"rdma","perftest_evidence":{"device":"mlx5_0","gid_index":3,"link_layer":"Ethernet","mtu":4096,"port":1,"transport":"IB"},"test":"ib_write_lat"}"#,
                r#"{"size_bytes":2,"count":null,"dtype":null,"op":"ib_write_lat","root":null,"in_place":null,"time_us":1.92,"algbw_gbs":null,"busbw_gbs":null,"wrong":null,"labels":{},"extra":{"t_max_us":5.1,"t_min_us":1.8,"t_p99_us":2.4}}"#,
            ),
        ),
        (
            "ucx",
            up(
                r#"{"kind":"ucx","memory":"cuda","ucx_env":["UCX_TLS"],"ucx_evidence":{"available":["cuda_copy","rc_mlx5"],"mode":"tag","selected":["rc_mlx5/mlx5_0:1"],"selected_line":"ep_cfg[0]: tag(rc_mlx5/mlx5_0:1)"},"ucx_transports":["rc","cuda_copy"],"ucx_version":"1.17.0"}"#,
                r#"{"size_bytes":8,"count":null,"dtype":null,"op":"tag_lat","root":null,"in_place":null,"time_us":0.82,"algbw_gbs":0.0098,"busbw_gbs":null,"wrong":null,"labels":{},"extra":{"msgrate":1219512.2}}"#,
            ),
        ),
        (
            "memcpy",
            up(
                r#"{"iters":10,"kind":"memcpy","peak_algbw_gbs":9.5,"sizes":4}"#,
                r#"{"size_bytes":16777216,"count":null,"dtype":null,"op":null,"root":null,"in_place":null,"time_us":1766.0,"algbw_gbs":9.5,"busbw_gbs":null,"wrong":null,"labels":{},"extra":null}"#,
            ),
        ),
        (
            "env",
            up(
                r#"{"env":{"CUDA_VISIBLE_DEVICES":"0,1","NCCL_DEBUG":"INFO"},"kind":"env"}"#,
                "",
            ),
        ),
        ("sleep", up(r#"{"kind":"sleep","slept_s":2.5}"#, "")),
        (
            "fail",
            r#"{"upload_key":"4f3c2b1a-0000-4000-8000-000000000001","outcome":"failed","reason":"exit status 3","exit_code":3,"stderr_tail":"boom\n","summary":{},"rows":[],"started_at":"2026-11-27T10:00:00Z","finished_at":"2026-11-27T10:00:01Z","claim_id":"9d0f8a5e-1b2c-4d3e-8f40-5a6b7c8d9e0f"}"#.into(),
        ),
        (
            "hung",
            up(
                r#"{"hung":{"last_size_bytes":4096,"limit_s":30,"silent_s":31.5,"stage":"size 4096 B"},"kind":"nccl","unparsed_stdout_lines":1}"#,
                "",
            ),
        ),
    ]
}

#[test]
fn every_kinds_spec_keeps_its_bytes() {
    for (kind, json) in SPECS {
        let spec: JobSpec =
            serde_json::from_str(json).unwrap_or_else(|e| panic!("{kind}: {e}\n{json}"));
        let again = serde_json::to_string(&spec).unwrap();
        assert_eq!(&again, json, "{kind}");
        let back: JobSpec = serde_json::from_str(&again).unwrap();
        assert_eq!(back, spec, "{kind}");
        // Read once, typed by its kind; a kind this build does not know is kept, untyped.
        match spec.params.typed() {
            Ok(typed) => assert_eq!(typed.kind(), spec.kind, "{kind}"),
            Err(e) => assert_eq!(
                e,
                &SpecParamsError::UnknownKind(spec.kind.clone()),
                "{kind}"
            ),
        }
    }
}

#[test]
fn every_kinds_result_keeps_its_bytes() {
    for (kind, json) in uploads() {
        let up: ResultUpload =
            serde_json::from_str(&json).unwrap_or_else(|e| panic!("{kind}: {e}\n{json}"));
        let again = serde_json::to_string(&up).unwrap();
        assert_eq!(again, json, "{kind}");
        let back: ResultUpload = serde_json::from_str(&again).unwrap();
        assert_eq!(back, up, "{kind}");
    }
}
