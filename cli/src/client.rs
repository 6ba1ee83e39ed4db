//! HTTP client for the API: bearer auth, TLS trust from `--ca-file` and `--pin-sha256`, and
//! API and connection errors turned into readable messages.

use heddle_types::ErrorBody;
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// `detail` is the whole cause chain (reqwest's own message names none), plus what to
    /// do when it is a TLS failure with a known remedy.
    #[error("cannot reach the Heddle server at {url}: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("cannot use the TLS settings: {0}")]
    Tls(#[from] heddle_tls::TlsError),
    #[error("cannot build the HTTP client: {0}")]
    Build(reqwest::Error),
    #[error("{status}: {message} ({code})")]
    Api {
        status: StatusCode,
        code: String,
        message: String,
    },
    #[error("unexpected answer from the server ({status}): {body}")]
    Unexpected { status: StatusCode, body: String },
    #[error("cannot encode the request: {0}")]
    Encode(serde_json::Error),
}

pub struct Client {
    pub base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl Client {
    /// `tls` applies when `base` is `https://`: the system's CA certificates plus
    /// `--ca-file`, and the pins if any.
    pub fn new(
        base: &str,
        token: Option<String>,
        tls: &heddle_tls::ClientTls,
    ) -> Result<Self, ClientError> {
        let base = base.trim_end_matches('/').to_string();
        let mut builder = reqwest::Client::builder();
        if let Some(config) = tls.for_urls([base.as_str()])? {
            builder = builder.use_preconfigured_tls(config);
        } else {
            // Plain HTTP only: no need to read the system's CA certificates.
            builder = builder.tls_built_in_root_certs(false);
        }
        Ok(Client {
            base,
            token,
            http: builder.build().map_err(ClientError::Build)?,
        })
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Body>,
    ) -> Result<reqwest::Response, ClientError> {
        let url = format!("{}{path}", self.base);
        let mut req = self.http.request(method, &url);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        req = match body {
            Some(Body::Json(v)) => req.json(&v),
            Some(Body::Wasm(bytes)) => req.header("content-type", "application/wasm").body(bytes),
            None => req,
        };
        let resp = req.send().await.map_err(|err| ClientError::Unreachable {
            url: self.base.clone(),
            detail: heddle_tls::describe(&err),
        })?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        Err(match serde_json::from_str::<ErrorBody>(&text) {
            Ok(e) => ClientError::Api {
                status,
                code: e.error,
                message: e.message,
            },
            Err(_) => ClientError::Unexpected { status, body: text },
        })
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let resp = self.send(Method::GET, path, None).await?;
        decode(resp).await
    }

    /// Every page of a list endpoint: asks again with each answer's `x-next-cursor` until
    /// an answer has none, and returns the rows of all pages in order.
    pub async fn get_all<T: DeserializeOwned>(&self, path: &str) -> Result<Vec<T>, ClientError> {
        let mut all = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page_path = match &cursor {
                None => path.to_string(),
                Some(c) => with_cursor(path, c),
            };
            let resp = self.send(Method::GET, &page_path, None).await?;
            let next = resp
                .headers()
                .get(heddle_types::NEXT_CURSOR_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let rows: Vec<T> = decode(resp).await?;
            all.extend(rows);
            match next {
                // A server that hands back the cursor it was given would never end.
                Some(n) if cursor.as_deref() != Some(n.as_str()) => cursor = Some(n),
                _ => return Ok(all),
            }
        }
    }

    pub async fn get_text(&self, path: &str) -> Result<String, ClientError> {
        let resp = self.send(Method::GET, path, None).await?;
        let status = resp.status();
        resp.text().await.map_err(|e| ClientError::Unexpected {
            status,
            body: e.to_string(),
        })
    }

    /// POSTs `body`, one of the request types of `heddle_types`, as JSON.
    pub async fn post<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        let body = serde_json::to_value(body).map_err(ClientError::Encode)?;
        let resp = self
            .send(Method::POST, path, Some(Body::Json(body)))
            .await?;
        decode(resp).await
    }

    /// PUTs `body`, one of the request types of `heddle_types`, as JSON: the resource's
    /// new content.
    pub async fn put<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        let body = serde_json::to_value(body).map_err(ClientError::Encode)?;
        let resp = self.send(Method::PUT, path, Some(Body::Json(body))).await?;
        decode(resp).await
    }

    /// POSTs without a body: an action on the resource at `path` (cancel, disable...).
    pub async fn post_empty<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let resp = self.send(Method::POST, path, None).await?;
        decode(resp).await
    }

    pub async fn post_wasm<T: DeserializeOwned>(
        &self,
        path: &str,
        bytes: Vec<u8>,
    ) -> Result<T, ClientError> {
        let resp = self
            .send(Method::POST, path, Some(Body::Wasm(bytes)))
            .await?;
        decode(resp).await
    }
}

enum Body {
    Json(serde_json::Value),
    Wasm(Vec<u8>),
}

async fn decode<T: DeserializeOwned>(resp: reqwest::Response) -> Result<T, ClientError> {
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    serde_json::from_str(&text).map_err(|e| ClientError::Unexpected {
        status,
        body: format!("{e}: {text}"),
    })
}

impl Client {
    pub async fn delete(&self, path: &str) -> Result<(), ClientError> {
        self.send(Method::DELETE, path, None).await.map(|_| ())
    }
}

/// `?k=v&...` of the pairs that have a value, each value percent-encoded.
pub fn query(pairs: &[(&str, &Option<String>)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", encode(v))))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

/// `path` with `cursor=` added to (or replacing the cursor in) its query string.
fn with_cursor(path: &str, cursor: &str) -> String {
    let (base, q) = path.split_once('?').unwrap_or((path, ""));
    let mut parts: Vec<String> = q
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("cursor="))
        .map(str::to_string)
        .collect();
    parts.push(format!("cursor={}", encode(cursor)));
    format!("{base}?{}", parts.join("&"))
}

/// Percent-encodes a query value.
pub fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::with_cursor;

    #[test]
    fn the_cursor_joins_or_replaces_the_query() {
        assert_eq!(
            with_cursor("/api/v1/nodes", "YzE6YQ"),
            "/api/v1/nodes?cursor=YzE6YQ"
        );
        assert_eq!(
            with_cursor("/api/v1/nodes?site=a&cursor=old", "new"),
            "/api/v1/nodes?site=a&cursor=new"
        );
    }
}
