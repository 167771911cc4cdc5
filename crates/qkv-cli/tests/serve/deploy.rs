//! deploy/'s container image and Kubernetes manifests against the server they run: no
//! Docker daemon or cluster runs them here, so what can drift is checked instead — the
//! flags they pass are flags `qkv serve` takes, the ports and paths agree, the grace
//! period outlasts the drain, and the autoscaler's metric is one `/metrics` serves.

use std::path::PathBuf;

use serde_json::Value;

use super::http::Server;
use super::model;

fn deploy(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text after `key` on the first line of `text` that has it, trimmed.
fn after<'a>(text: &'a str, key: &str) -> &'a str {
    let line = text
        .lines()
        .find(|l| l.contains(key))
        .unwrap_or_else(|| panic!("no `{key}` in {text}"));
    line[line.find(key).unwrap() + key.len()..].trim()
}

/// A flow sequence of strings (`["--grace", "30"]`), which is JSON too.
fn strings(flow: &str) -> Vec<String> {
    let v: Value = serde_json::from_str(flow).unwrap_or_else(|e| panic!("{flow}: {e}"));
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// The value after `flag` in `args`.
fn flag<'a>(args: &'a [String], flag: &str) -> &'a str {
    let i = args.iter().position(|a| a == flag);
    let i = i.unwrap_or_else(|| panic!("no {flag} in {args:?}"));
    &args[i + 1]
}

#[test]
fn the_deploy_files_agree_with_the_server_they_run() {
    let dockerfile = deploy("Dockerfile");
    let deployment = deploy("k8s/deployment.yaml");
    let autoscaler = deploy("k8s/autoscaler.yaml");
    let entrypoint = strings(after(&dockerfile, "ENTRYPOINT"));
    let args = strings(after(&deployment, "args:"));
    assert_eq!(&entrypoint[..2], ["qkv", "serve"]);

    // one port: the image's, the server's, the container's, the scrape's
    let port = flag(&entrypoint, "--port");
    assert_eq!(after(&dockerfile, "EXPOSE"), port);
    assert!(after(&deployment, "containerPort:").starts_with(&format!("{port}}}")));
    assert_eq!(
        after(&deployment, "prometheus.io/port:"),
        format!("\"{port}\"")
    );
    assert_eq!(after(&deployment, "prometheus.io/path:"), "/metrics");
    assert_eq!(flag(&entrypoint, "--host"), "0.0.0.0");
    assert_eq!(flag(&entrypoint, "--model"), "/model");
    assert!(after(&deployment, "mountPath:").starts_with("/model,"));

    // Kubernetes kills a pod this long after SIGTERM: the drain (--grace) must end first
    let grace: u64 = flag(&args, "--grace").parse().unwrap();
    let period: u64 = after(&deployment, "terminationGracePeriodSeconds:")
        .parse()
        .unwrap();
    assert!(
        period > grace,
        "terminationGracePeriodSeconds {period} ≤ --grace {grace}"
    );
    assert!(after(&deployment, "httpGet:").starts_with("{path: /health,"));
    assert_eq!(after(&dockerfile, "USER"), after(&deployment, "runAsUser:"));

    // the server takes the Deployment's flags (less --threads, which the test sets for
    // its two cores), answers /health, and serves the autoscaler's metric as a gauge
    let i = args.iter().position(|a| a == "--threads").unwrap();
    let mut taken: Vec<&str> = args.iter().map(String::as_str).collect();
    taken.drain(i..i + 2);
    let s = Server::start(model(), &taken);
    assert_eq!(s.get("/health").status, 200);
    let metric = after(&autoscaler, "metric: {name:").trim_end_matches('}');
    let metrics = s.get("/metrics").body;
    assert!(
        metrics.contains(&format!("# TYPE {metric} gauge\n{metric} ")),
        "{metric} not served as a gauge:\n{metrics}"
    );
}
