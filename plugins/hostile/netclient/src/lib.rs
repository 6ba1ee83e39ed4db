//! A plugin that opens a TCP connection, so its component imports `wasi:sockets`: the host
//! must refuse it before it ever runs, naming the import.

use heddle_plugin_sdk::{Detection, Facts, Info, Plugin, PluginError};

pub struct NetClient;

impl Plugin for NetClient {
    fn info() -> Info {
        Info::new(
            "netclient",
            env!("CARGO_PKG_VERSION"),
            "tries to phone home (host tests only)",
        )
    }

    fn detect(_facts: &Facts) -> Result<Detection, PluginError> {
        let stream = std::net::TcpStream::connect("198.51.100.7:443")
            .map_err(|e| PluginError::new("network", e.to_string()))?;
        let mut d = Detection::default();
        d.add_trait("netclient.peer", &format!("{:?}", stream.peer_addr()));
        Ok(d)
    }
}

heddle_plugin_sdk::export_plugin!(NetClient);
