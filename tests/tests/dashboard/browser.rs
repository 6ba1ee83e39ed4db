//! Headless Chromium through chromedriver, shared by the dashboard tests: the built
//! dashboard's folder, a browser session, and waits for what a page shows.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn dashboard_dist() -> PathBuf {
    let dist = repo().join("frontend/dist");
    assert!(
        dist.join("index.html").is_file() && dist.join("heddle_frontend_bg.wasm").is_file(),
        "{} has no built dashboard: run scripts/build-frontend.sh first",
        dist.display()
    );
    dist.canonicalize().unwrap()
}

/// chromedriver on a free port, killed on drop.
pub struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub async fn browser() -> (Driver, Client) {
    let bin = std::env::var("HEDDLE_CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
    let port = heddle_e2e::free_port();
    let child = Command::new(&bin)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start {bin}: {e}; install chromium and chromium-driver (apt)")
        });
    let driver = Driver(child);
    let mut opts = json!({"args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,2000"]});
    if Path::new("/usr/bin/chromium").exists() {
        opts["binary"] = json!("/usr/bin/chromium");
    }
    let mut caps = serde_json::Map::new();
    caps.insert("goog:chromeOptions".into(), opts);
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match ClientBuilder::new(connector)
            .capabilities(caps.clone())
            .connect(&url)
            .await
        {
            Ok(c) => return (driver, c),
            Err(e) if Instant::now() > deadline => {
                panic!("chromedriver at {url} did not start a session: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Polls until the first element matching `css` contains `needle`; the page's text on failure.
pub async fn wait_text(c: &Client, css: &str, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(el) = c.find(Locator::Css(css)).await
            && let Ok(t) = el.text().await
            && t.contains(needle)
        {
            return t;
        }
        if Instant::now() > deadline {
            let body = match c.find(Locator::Css("body")).await {
                Ok(b) => b.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            panic!("{css:?} never contained {needle:?}; the page says:\n{body}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn click(c: &Client, css: &str) {
    c.wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .unwrap();
}

pub async fn type_into(c: &Client, css: &str, text: &str) {
    let el = c
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css(css))
        .await
        .unwrap();
    el.clear().await.unwrap();
    el.send_keys(text).await.unwrap();
}

/// Types `token` into the sign-in form on screen and submits it.
pub async fn submit_token(c: &Client, token: &str) {
    type_into(c, "#token", token).await;
    click(c, ".signin button[type=submit]").await;
}

/// Opens the dashboard at `url` and signs in with the admin's `token`.
pub async fn sign_in_as_admin(c: &Client, url: &str, token: &str) {
    c.goto(url).await.unwrap();
    submit_token(c, token).await;
    wait_text(c, "#who", "(admin)").await;
}

/// Opens the fleet page afresh (with the session signed in) and times its first render:
/// (the page's own `heddle:fleet-rendered` mark after navigation start, when WebDriver
/// first saw a row), in milliseconds.
pub async fn first_fleet_render(c: &Client, url: &str) -> (f64, f64) {
    let t0 = Instant::now();
    c.goto(&format!("{url}/")).await.unwrap();
    c.wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css("#fleet-table tbody tr"))
        .await
        .unwrap();
    let seen_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let mark_ms = c
        .execute(
            "return performance.getEntriesByName('heddle:fleet-rendered')[0].startTime",
            vec![],
        )
        .await
        .unwrap()
        .as_f64()
        .expect("the fleet page marks its first render");
    (mark_ms, seen_ms)
}
