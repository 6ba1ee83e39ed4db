//! A plugin that opens a TCP connection, so its component imports `wasi:sockets` as CPython's
//! does: the host links the import and refuses the connection, so the plugin gets an error
//! and nothing else.

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
        use std::net::ToSocketAddrs;
        if let Ok(found) = ("example.com", 443).to_socket_addrs() {
            return Err(PluginError::new(
                "resolved",
                format!("{:?}", found.collect::<Vec<_>>()),
            ));
        }
        let stream = std::net::TcpStream::connect("198.51.100.7:443")
            .map_err(|e| PluginError::new("network", e.to_string()))?;
        let mut d = Detection::default();
        d.add_trait("netclient.peer", &format!("{:?}", stream.peer_addr()));
        Ok(d)
    }
}

heddle_plugin_sdk::export_plugin!(NetClient);
