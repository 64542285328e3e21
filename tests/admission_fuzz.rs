//! Fuzzing admission: hostile AdmissionReviews for every kind and operation through the real
//! HTTPS endpoints, arbitrary typed specs through the pure validators, and a corpus of hostile
//! bodies replayed on every run.
//!
//! - Over HTTPS (one in-process server per kind): valid reviews mutated at random (a subtree
//!   replaced, deleted or turned into another JSON type, or raw hostile text spliced in: 10,000
//!   levels of nesting, `1e400`, `2^64`, `-0`, `2147483648`, lone surrogate escapes, NUL, RTL
//!   marks, emoji, very long strings), random JSON, random bytes. The answer is always a 200
//!   AdmissionReview that allows, or denies with a message, or a 4xx with a body; never a 5xx,
//!   never a hang; and `/healthz` still answers afterwards.
//! - Pure validators: typed specs over the whole `i32` range and with random strings for names,
//!   references, zones and annotation keys; no panic, and a cluster spec that
//!   `cluster_problems` finds fault with is denied with each of those problems.
//! - `tests/corpus/admission/*.json`: hand-picked hostile bodies, each sent to every endpoint
//!   under the same rule; those named `deny-*` must also never be allowed.
//!
//! Run: `cargo test --test admission_fuzz -- --nocapture` (prints how many cases ran; part of
//! `make test-unit`). A failing generated case is shrunk, printed and kept in
//! `tests/admission_fuzz.proptest-regressions`; an interesting one belongs in the corpus.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::time::Duration;

use harness::https::{TestServer, admission_review, image_spec, object, standard_fleet};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::core::admission::Operation;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use serde_json::{Value, json};
use valkey_operator::admission::{
    Policy, Review, Verdict, validate_cluster, validate_config, validate_image, validate_node,
    validate_role,
};
use valkey_operator::api::bounds::{Caps, cluster_problems};
use valkey_operator::api::*;
use valkey_operator::fleet::Fleet;

/// Generated reviews per kind over HTTPS (a debug build answers a few hundred a second).
const HTTPS_CASES: u32 = 64;
/// Generated typed specs per pure validator (cheap: no I/O).
const TYPED_CASES: u32 = 512;
/// Longest wait for one answer before the server counts as hanging.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/corpus/admission");

// ---------------------------------------------------------------------------------------------
// The fleet and the valid reviews the mutations start from.

/// `standard` on 9.0.0, inherited by `large`; `legacy` on an 8.1.4 image stored before the
/// webhook; a role `reader`; a few clusters.
fn fleet() -> Fleet {
    let mut fleet = standard_fleet([
        ("team-a", "orders", "standard"),
        ("team-b", "sessions", "large"),
        ("team-c", "old", "legacy"),
    ]);
    fleet.upsert_image("valkey-8-1-4", image_spec("8.1.4"));
    fleet.upsert_config(
        "legacy",
        ValkeyConfigSpec {
            image_ref: Some("valkey-8-1-4".into()),
            ..Default::default()
        },
    );
    fleet.upsert_role(
        "reader",
        ValkeyRoleSpec {
            categories: vec![Permission {
                name: "read".into(),
                subcommand: None,
                access: Access::Allow,
            }],
            commands: vec![],
        },
    );
    // The namespace the cluster reviews are in has a policy, so its rules meet every mutation.
    fleet.upsert_policy(
        "team-d-limits",
        valkey_operator::api::ValkeyNamespacePolicySpec {
            namespaces: vec!["team-d".into()],
            allowed_configs: vec!["standard".into(), "large".into()],
            max_clusters: Some(4),
            max_shards: Some(64),
            max_nodes: Some(256),
        },
    );
    fleet
}

/// One of the five kinds as its endpoint sees it: a valid object of it to mutate.
#[derive(Clone, Copy, Debug)]
struct Kind {
    name: &'static str,
    path: &'static str,
    namespace: Option<&'static str>,
    object_name: &'static str,
}

const IMAGE: Kind = Kind {
    name: "ValkeyImage",
    path: "/validate/valkeyimages",
    namespace: None,
    object_name: "valkey-9-1-2",
};
/// Not in the fleet: a config in use may not be deleted, and the unmutated review must pass.
const CONFIG: Kind = Kind {
    name: "ValkeyConfig",
    path: "/validate/valkeyconfigs",
    namespace: None,
    object_name: "spare",
};
const ROLE: Kind = Kind {
    name: "ValkeyRole",
    path: "/validate/valkeyroles",
    namespace: None,
    object_name: "writer",
};
const CLUSTER: Kind = Kind {
    name: "ValkeyCluster",
    path: "/validate/valkeyclusters",
    namespace: Some("team-d"),
    object_name: "feed",
};
const NODE: Kind = Kind {
    name: "ValkeyNode",
    path: "/validate/valkeynodes",
    namespace: Some("team-a"),
    object_name: "orders-0-abcde",
};
const KINDS: [Kind; 5] = [IMAGE, CONFIG, ROLE, CLUSTER, NODE];

impl Kind {
    /// A spec the validator allows, with something in every field worth mutating.
    fn valid_spec(self) -> Value {
        match self.name {
            "ValkeyImage" => {
                json!({"repository": "valkey/valkey", "tag": "9.1.2", "version": "9.1.2"})
            }
            "ValkeyConfig" => json!({
                "baseRef": "standard",
                "resources": {"cpu": "500m", "memory": "2Gi"},
                "valkey": {"maxmemory-policy": "allkeys-lru", "hz": "20"},
            }),
            "ValkeyRole" => json!({
                "categories": [{"name": "read", "access": "allow"}, {"name": "write", "access": "allow"}],
                "commands": [{"name": "flushall", "access": "deny"}],
            }),
            "ValkeyCluster" => json!({
                "configRef": "large",
                "shards": 3,
                "replicasPerShard": 1,
                "acl": [{
                    "username": "app",
                    "passwordHashes": ["5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"],
                    "permissions": [{"roleRef": "reader", "keys": [{"pattern": "app:*", "access": "readwrite"}]}],
                }],
                "placement": {"zones": ["zone-a", "zone-b"], "zoneSpread": "required", "nodeSelector": {"disktype": "ssd"}},
                "podAnnotations": {"example.com/team": "feeds"},
            }),
            "ValkeyNode" => json!({
                "cluster": "orders",
                "shard": 0,
                "image": "valkey/valkey:9.0.0",
                "version": "9.0.0",
                "revision": "r1",
            }),
            other => panic!("no spec for {other}"),
        }
    }

    fn valid_object(self) -> Value {
        let mut object = object(
            self.name,
            self.object_name,
            self.namespace,
            self.valid_spec(),
        );
        if self.name == "ValkeyNode" {
            object["metadata"]["ownerReferences"] = json!([{
                "apiVersion": "valkey.gomomento.com/v1alpha1",
                "kind": "ValkeyCluster",
                "name": "orders",
                "uid": "orders-uid",
                "controller": true,
                "blockOwnerDeletion": true,
            }]);
        }
        object
    }

    /// The review the API server would send for `operation` on the valid object.
    fn valid_review(self, operation: &str) -> Value {
        let object = self.valid_object();
        let (new, old) = match operation {
            "CREATE" | "CONNECT" => (Some(object), None),
            "UPDATE" => (Some(object.clone()), Some(object)),
            _ => (None, Some(object)),
        };
        admission_review(
            self.name,
            operation,
            self.object_name,
            self.namespace,
            new,
            old,
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Hostile values and bodies.

/// Raw JSON text that a `serde_json::Value` cannot hold (or would normalise), spliced into a
/// serialized review or sent as the whole body.
#[derive(Clone, Copy, Debug)]
enum Hostile {
    /// 10,000 levels of arrays: far past any parser's recursion limit.
    DeepArrays,
    DeepObjects,
    /// 120 levels: under serde_json's limit of 128, so it reaches the typed conversion.
    NestedUnderTheLimit,
    Exponent400,
    NegativeExponent400,
    TinyExponent,
    TwoPow64,
    PastI32,
    BelowI32,
    NegativeZero,
    Fraction,
    Past53Bits,
    LoneHighSurrogate,
    LoneLowSurrogate,
    ReversedSurrogates,
    EscapedNul,
    NotJson,
    Nothing,
}

impl Hostile {
    const ALL: [Hostile; 18] = [
        Hostile::DeepArrays,
        Hostile::DeepObjects,
        Hostile::NestedUnderTheLimit,
        Hostile::Exponent400,
        Hostile::NegativeExponent400,
        Hostile::TinyExponent,
        Hostile::TwoPow64,
        Hostile::PastI32,
        Hostile::BelowI32,
        Hostile::NegativeZero,
        Hostile::Fraction,
        Hostile::Past53Bits,
        Hostile::LoneHighSurrogate,
        Hostile::LoneLowSurrogate,
        Hostile::ReversedSurrogates,
        Hostile::EscapedNul,
        Hostile::NotJson,
        Hostile::Nothing,
    ];

    fn text(self) -> String {
        let nested = |levels: usize| format!("{}{}", "[".repeat(levels), "]".repeat(levels));
        match self {
            Hostile::DeepArrays => nested(10_000),
            Hostile::DeepObjects => format!("{}1{}", r#"{"a":"#.repeat(10_000), "}".repeat(10_000)),
            Hostile::NestedUnderTheLimit => nested(120),
            Hostile::Exponent400 => "1e400".into(),
            Hostile::NegativeExponent400 => "-1e400".into(),
            Hostile::TinyExponent => "1e-400".into(),
            Hostile::TwoPow64 => "18446744073709551616".into(),
            Hostile::PastI32 => "2147483648".into(),
            Hostile::BelowI32 => "-2147483649".into(),
            Hostile::NegativeZero => "-0".into(),
            Hostile::Fraction => "2.5".into(),
            Hostile::Past53Bits => "9007199254740993".into(),
            Hostile::LoneHighSurrogate => r#""\ud800""#.into(),
            Hostile::LoneLowSurrogate => r#""x\udc00y""#.into(),
            Hostile::ReversedSurrogates => r#""\udc00\ud800""#.into(),
            Hostile::EscapedNul => r#""a\u0000b""#.into(),
            Hostile::NotJson => "NaN".into(),
            Hostile::Nothing => String::new(),
        }
    }
}

fn hostile() -> impl Strategy<Value = Hostile> {
    prop::sample::select(Hostile::ALL.to_vec())
}

/// Strings a careless validator trips over, and ordinary ones.
fn odd_string() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => ".{0,40}",
        2 => "[a-z][-a-z0-9]{0,20}",
        1 => prop::sample::select(vec![
            "", "\0", "a\0b", "\u{202E}evil\u{202C}", "\u{200F}", "\u{FEFF}", "👩‍👩‍👧‍👦🔥",
            "e\u{301}", "ValkeyImage", "ValkeyConfig", "ValkeyRole", "ValkeyCluster",
            "ValkeyNode", "Pod", "v1", "admission.k8s.io/v1beta1", "valkey.gomomento.com/x",
            "bad key!", "default", "@all", "+flushall", "8.1.4", "9.0.0", "99999999999.0.0",
            "CREATE", "DELETE", "CONNECT", "UPDATE", "standard", "legacy",
        ])
        .prop_map(String::from),
        1 => (0..3usize).prop_map(|which| ["x", "é", "🔥"][which].repeat(30_000)),
    ]
}

/// Numbers at the edges of what the fields hold (`i32` shards and replicas, `u64`, floats).
fn interesting_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        prop::sample::select(vec![
            json!(0),
            json!(-1),
            json!(1),
            json!(15),
            json!(16),
            json!(2000),
            json!(16384),
            json!(16385),
            json!(100_000),
            json!(i32::MAX),
            json!(i64::from(i32::MAX) + 1),
            json!(i32::MIN),
            json!(i64::MAX),
            json!(u64::MAX),
            json!(1.5),
            json!(-0.0),
            json!(1e300),
        ]),
        any::<i32>().prop_map(Value::from),
    ]
}

/// Random JSON, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        prop_oneof![
            Just(i64::from(i32::MAX) + 1),
            Just(i64::from(i32::MIN) - 1),
            Just(0),
            Just(-1)
        ]
        .prop_map(Value::from),
        any::<f64>().prop_filter_map("JSON has no NaN or infinity", |f| {
            serde_json::Number::from_f64(f).map(Value::Number)
        }),
        odd_string().prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(odd_string(), inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// Where in a review a mutation starts its random walk: the places a validator reads (the
/// objects' specs several times, as most of the checks are there).
const ANCHORS: &[&[&str]] = &[
    &[],
    &["kind"],
    &["apiVersion"],
    &["request"],
    &["request", "uid"],
    &["request", "kind"],
    &["request", "kind", "kind"],
    &["request", "kind", "group"],
    &["request", "operation"],
    &["request", "name"],
    &["request", "namespace"],
    &["request", "object"],
    &["request", "object", "kind"],
    &["request", "object", "apiVersion"],
    &["request", "object", "metadata"],
    &["request", "object", "metadata"],
    &["request", "object", "spec"],
    &["request", "object", "spec"],
    &["request", "object", "spec"],
    &["request", "object", "spec"],
    &["request", "object", "spec"],
    &["request", "object", "spec"],
    &["request", "oldObject"],
    &["request", "oldObject", "spec"],
    &["request", "oldObject", "spec"],
];

#[derive(Clone, Debug)]
enum Change {
    /// A value of the same JSON type, so the review still parses and reaches the validator: a
    /// string becomes `text`, a number `number`, a bool flips, a list or map gains `extra`.
    Similar {
        text: String,
        number: Value,
        extra: Value,
    },
    Replace(Value),
    Delete,
    /// String ↔ number, array ↔ object, and so on.
    SwapType,
    Splice(Hostile),
}

/// One mutation: a place (an anchor, then up to a few random steps down) and what happens there.
#[derive(Clone, Debug)]
struct Mutation {
    anchor: usize,
    walk: Vec<Index>,
    change: Change,
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let similar =
        (odd_string(), interesting_number(), any_json()).prop_map(|(text, number, extra)| {
            Change::Similar {
                text,
                number,
                extra,
            }
        });
    let change = prop_oneof![
        5 => similar,
        2 => any_json().prop_map(Change::Replace),
        2 => Just(Change::Delete),
        2 => Just(Change::SwapType),
        2 => hostile().prop_map(Change::Splice),
    ];
    (
        0..ANCHORS.len(),
        prop::collection::vec(any::<Index>(), 0..4),
        change,
    )
        .prop_map(|(anchor, walk, change)| Mutation {
            anchor,
            walk,
            change,
        })
}

#[derive(Clone, Debug)]
enum Step {
    Key(String),
    Item(usize),
}

/// The concrete path of a mutation in `root`: as far along the anchor as exists, then the walk.
fn locate(root: &Value, mutation: &Mutation) -> Vec<Step> {
    let mut path = Vec::new();
    let mut node = root;
    for key in ANCHORS[mutation.anchor] {
        match node.get(key) {
            Some(child) => {
                path.push(Step::Key((*key).to_string()));
                node = child;
            }
            None => break,
        }
    }
    for index in &mutation.walk {
        match node {
            Value::Object(map) if !map.is_empty() => {
                let (key, child) = map.iter().nth(index.index(map.len())).unwrap();
                path.push(Step::Key(key.clone()));
                node = child;
            }
            Value::Array(items) if !items.is_empty() => {
                let at = index.index(items.len());
                path.push(Step::Item(at));
                node = &items[at];
            }
            _ => break,
        }
    }
    path
}

fn at_mut<'a>(root: &'a mut Value, path: &[Step]) -> &'a mut Value {
    path.iter().fold(root, |node, step| match step {
        Step::Key(key) => &mut node[key.as_str()],
        Step::Item(at) => &mut node[*at],
    })
}

fn swapped(value: &Value) -> Value {
    match value {
        Value::Null => json!({}),
        Value::Bool(b) => Value::from(b.to_string()),
        Value::Number(n) => Value::from(n.to_string()),
        Value::String(s) => s
            .parse::<f64>()
            .map_or_else(|_| Value::from(s.len()), |f| json!(f)),
        Value::Array(items) => Value::Object(
            items
                .iter()
                .enumerate()
                .map(|(i, item)| (i.to_string(), item.clone()))
                .collect(),
        ),
        Value::Object(map) => Value::Array(map.values().cloned().collect()),
    }
}

fn similar(value: &Value, text: &str, number: &Value, extra: &Value) -> Value {
    match value {
        Value::String(_) => Value::from(text),
        Value::Number(_) => number.clone(),
        Value::Bool(b) => Value::Bool(!b),
        Value::Array(items) => {
            let mut items = items.clone();
            items.push(extra.clone());
            Value::Array(items)
        }
        Value::Object(map) => {
            let mut map = map.clone();
            map.insert(text.to_string(), extra.clone());
            Value::Object(map)
        }
        Value::Null => extra.clone(),
    }
}

/// Applies the mutations in turn; spliced raw text is left as placeholders, returned with the
/// text each stands for.
fn mutate(review: &mut Value, mutations: &[Mutation]) -> Vec<(String, String)> {
    let mut splices = Vec::new();
    for mutation in mutations {
        let path = locate(review, mutation);
        match &mutation.change {
            Change::Similar {
                text,
                number,
                extra,
            } => {
                let target = at_mut(review, &path);
                *target = similar(target, text, number, extra);
            }
            Change::Replace(value) => *at_mut(review, &path) = value.clone(),
            Change::SwapType => {
                let target = at_mut(review, &path);
                *target = swapped(target);
            }
            Change::Delete => match path.split_last() {
                None => *review = Value::Null,
                Some((Step::Key(key), parent)) => {
                    if let Some(map) = at_mut(review, parent).as_object_mut() {
                        map.remove(key);
                    }
                }
                Some((Step::Item(at), parent)) => {
                    if let Some(items) = at_mut(review, parent).as_array_mut() {
                        items.remove(*at);
                    }
                }
            },
            Change::Splice(hostile) => {
                let placeholder = format!("__hostile_{}__", splices.len());
                *at_mut(review, &path) = Value::from(placeholder.clone());
                splices.push((format!("{placeholder:?}"), hostile.text()));
            }
        }
    }
    splices
}

/// A generated request body.
#[derive(Clone, Debug)]
enum Body {
    /// A valid review of the endpoint's kind for an operation, then mutated.
    Review {
        operation: &'static str,
        mutations: Vec<Mutation>,
    },
    Json(Value),
    Raw(Hostile),
    Bytes(Vec<u8>),
}

fn operation() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["CREATE", "UPDATE", "DELETE", "CONNECT"])
}

fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        8 => (operation(), prop::collection::vec(mutation(), 0..4))
            .prop_map(|(operation, mutations)| Body::Review { operation, mutations }),
        1 => any_json().prop_map(Body::Json),
        1 => hostile().prop_map(Body::Raw),
        1 => prop::collection::vec(any::<u8>(), 0..256).prop_map(Body::Bytes),
    ]
}

impl Body {
    fn render(&self, kind: Kind) -> Vec<u8> {
        match self {
            Body::Review {
                operation,
                mutations,
            } => {
                let mut review = kind.valid_review(operation);
                let splices = mutate(&mut review, mutations);
                let mut text = serde_json::to_string(&review).unwrap();
                for (placeholder, raw) in splices {
                    text = text.replace(&placeholder, &raw);
                }
                text.into_bytes()
            }
            Body::Json(value) => serde_json::to_vec(value).unwrap(),
            Body::Raw(hostile) => hostile.text().into_bytes(),
            Body::Bytes(bytes) => bytes.clone(),
        }
    }

    fn is_valid_review(&self) -> bool {
        matches!(self, Body::Review { mutations, .. } if mutations.is_empty())
    }
}

// ---------------------------------------------------------------------------------------------
// Sending, and the rule every answer obeys.

/// POSTs `body` and returns the status and body, or why there was none (a hang, a dropped
/// connection).
async fn send(server: &TestServer, path: &str, body: Vec<u8>) -> Result<(u16, String), String> {
    let request = server
        .client
        .post(format!("{}{path}", server.base_url))
        .header("content-type", "application/json")
        .body(body)
        .send();
    let answer = async {
        let response = request.await.map_err(|e| format!("no answer: {e:?}"))?;
        let status = response.status().as_u16();
        let text = response
            .text()
            .await
            .map_err(|e| format!("no body: {e:?}"))?;
        Ok((status, text))
    };
    tokio::time::timeout(ANSWER_TIMEOUT, answer)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {ANSWER_TIMEOUT:?} (a hang)")))
}

/// The answer rule: a 200 AdmissionReview that allows, or denies with a message (for the
/// request's uid and in its apiVersion, as the API server checks), or a 4xx with a reason.
/// Returns which of those it was: `allowed`, `denied` or the status.
fn check_answer(sent: &[u8], status: u16, text: &str) -> Result<String, String> {
    match status {
        200 => {
            let answer: Value = serde_json::from_str(text)
                .map_err(|e| format!("200 whose body is not JSON ({e}): {text}"))?;
            if answer["kind"] != "AdmissionReview" {
                return Err(format!("200 that is not an AdmissionReview: {text}"));
            }
            let response = &answer["response"];
            if let Ok(sent) = serde_json::from_slice::<Value>(sent) {
                if answer["apiVersion"] != sent["apiVersion"] {
                    return Err(format!("answered in another apiVersion than asked: {text}"));
                }
                if let Some(uid) = sent["request"]["uid"].as_str()
                    && response["uid"] != uid
                {
                    return Err(format!("answered for another uid than {uid:?}: {text}"));
                }
            }
            match response["allowed"].as_bool() {
                Some(true) => Ok("allowed".into()),
                Some(false) => match response["status"]["message"].as_str() {
                    Some(message) if !message.trim().is_empty() => Ok("denied".into()),
                    _ => Err(format!("a denial without a message: {text}")),
                },
                None => Err(format!("no `allowed` in the answer: {text}")),
            }
        }
        400..=499 if !text.trim().is_empty() => Ok(status.to_string()),
        400..=499 => Err(format!("{status} with an empty body")),
        _ => Err(format!("{status}: {text}")),
    }
}

fn shown(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    if text.chars().count() <= 600 {
        return text.into_owned();
    }
    let head: String = text.chars().take(300).collect();
    let tail: String = text
        .chars()
        .rev()
        .take(200)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    format!("{head} …[{} bytes in all]… {tail}", body.len())
}

/// One server for a test, with the runtime it runs on (proptest's runner is synchronous).
struct Served {
    runtime: tokio::runtime::Runtime,
    server: TestServer,
    _dir: tempfile::TempDir,
}

impl Served {
    fn start() -> Self {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let server = runtime.block_on(TestServer::start(
            dir.path(),
            fleet(),
            Policy::default(),
            Duration::from_secs(60),
        ));
        Self {
            runtime,
            server,
            _dir: dir,
        }
    }

    /// Sends `body` to `path` and checks the answer; which answer it was.
    fn exchange(&self, path: &str, body: Vec<u8>) -> Result<String, String> {
        let (status, text) = self
            .runtime
            .block_on(send(&self.server, path, body.clone()))?;
        check_answer(&body, status, &text)
    }

    /// `/healthz` answers on a new request, then the server stops cleanly.
    fn stop_healthy(self) {
        let health = self.runtime.block_on(async {
            let response = self
                .server
                .client
                .get(format!("{}/healthz", self.server.base_url))
                .send();
            let response = tokio::time::timeout(ANSWER_TIMEOUT, response)
                .await
                .expect("/healthz answers")
                .expect("/healthz answers");
            (response.status().as_u16(), response.text().await.unwrap())
        });
        assert_eq!(health, (200, "ok\n".to_string()));
        self.runtime.block_on(self.server.stop());
    }
}

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        max_shrink_iters: 256,
        source_file: Some(file!()),
        // Beside this file: `SourceParallel` looks for a lib.rs above it and warns.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..Config::default()
    })
}

// ---------------------------------------------------------------------------------------------
// (a) Generated reviews over HTTPS, one test per kind.

fn fuzz_endpoint(kind: Kind) {
    let served = Served::start();
    let cases = Cell::new(0usize);
    let answers = RefCell::new(BTreeMap::<String, usize>::new());
    let result = runner(HTTPS_CASES).run(&body(), |case| {
        cases.set(cases.get() + 1);
        let body = case.render(kind);
        let shown_body = shown(&body);
        let answer = served
            .exchange(kind.path, body)
            .map_err(|problem| TestCaseError::fail(format!("{problem}\nbody: {shown_body}")))?;
        if case.is_valid_review() {
            prop_assert_eq!(
                &answer,
                "allowed",
                "an unmutated valid review: {}",
                shown_body
            );
        }
        *answers.borrow_mut().entry(answer).or_default() += 1;
        Ok(())
    });
    println!(
        "{}: {} generated reviews over HTTPS, answered {:?}",
        kind.name,
        cases.get(),
        answers.borrow()
    );
    if let Err(error) = result {
        panic!("{} {}: {error}", kind.name, kind.path);
    }
    served.stop_healthy();
}

#[test]
fn generated_image_reviews_get_clean_answers() {
    fuzz_endpoint(IMAGE);
}

#[test]
fn generated_config_reviews_get_clean_answers() {
    fuzz_endpoint(CONFIG);
}

#[test]
fn generated_role_reviews_get_clean_answers() {
    fuzz_endpoint(ROLE);
}

#[test]
fn generated_cluster_reviews_get_clean_answers() {
    fuzz_endpoint(CLUSTER);
}

#[test]
fn generated_node_reviews_get_clean_answers() {
    fuzz_endpoint(NODE);
}

// ---------------------------------------------------------------------------------------------
// The corpus of hostile bodies, replayed on every endpoint.

#[test]
fn the_corpus_gets_clean_answers_on_every_endpoint() {
    let mut files: Vec<_> = std::fs::read_dir(CORPUS)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 10, "the corpus in {CORPUS} is missing");
    let served = Served::start();
    let mut problems = Vec::new();
    for file in &files {
        let body = std::fs::read(file).unwrap();
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        for kind in KINDS {
            match served.exchange(kind.path, body.clone()) {
                Ok(answer) if answer == "allowed" && name.starts_with("deny-") => {
                    problems.push(format!("{name} on {}: allowed", kind.path));
                }
                Ok(_) => {}
                Err(problem) => problems.push(format!("{name} on {}: {problem}", kind.path)),
            }
        }
    }
    println!(
        "corpus: {} files × {} endpoints replayed",
        files.len(),
        KINDS.len()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    served.stop_healthy();
}

/// Each `deny-*` file on its own endpoint, and the reason its denial must give: refused for
/// another reason, it would no longer test what it was kept for.
const CORPUS_REASONS: [(&str, &str, &str); 26] = [
    (
        "deny-100000-shards",
        "/validate/valkeyclusters",
        "spec.shards: is 100000; it must be 1 to 16384",
    ),
    (
        "deny-60-char-name",
        "/validate/valkeyclusters",
        "metadata.name: is 60 characters long",
    ),
    (
        "deny-bad-annotation-key",
        "/validate/valkeyclusters",
        "is not a valid annotation key: its name part",
    ),
    (
        "deny-config-base-ref-cycle",
        "/validate/valkeyconfigs",
        "cycle",
    ),
    (
        "deny-deep-nesting-arrays",
        "/validate/valkeyclusters",
        "recursion limit exceeded",
    ),
    (
        "deny-deep-nesting-in-spec",
        "/validate/valkeyclusters",
        "recursion limit exceeded",
    ),
    (
        "deny-image-below-floor",
        "/validate/valkeyimages",
        "below the Valkey 9 floor",
    ),
    (
        "deny-lone-surrogate-in-config-ref",
        "/validate/valkeyclusters",
        "surrogate",
    ),
    (
        "deny-lone-surrogate-in-name",
        "/validate/valkeyclusters",
        "the body is not JSON: unexpected end of hex escape",
    ),
    (
        "deny-long-config-ref",
        "/validate/valkeyclusters",
        "spec.configRef: must be 1 to 253 characters long",
    ),
    (
        "deny-nesting-under-parser-limit-in-spec",
        "/validate/valkeyclusters",
        "does not match its schema",
    ),
    (
        "deny-node-without-owner",
        "/validate/valkeynodes",
        "ValkeyNodes are created by the operator",
    ),
    (
        "deny-not-an-admission-review",
        "/validate/valkeyclusters",
        "not an AdmissionReview",
    ),
    (
        "deny-nul-in-name",
        "/validate/valkeyclusters",
        "metadata.name: must consist of lowercase letters",
    ),
    (
        "deny-null-request",
        "/validate/valkeyclusters",
        "carries no request",
    ),
    (
        "deny-object-is-a-string",
        "/validate/valkeyclusters",
        "not an admission.k8s.io/v1 AdmissionReview",
    ),
    (
        "deny-role-with-acl-syntax",
        "/validate/valkeyroles",
        "without ACL syntax",
    ),
    (
        "deny-rtl-and-emoji-zone",
        "/validate/valkeyclusters",
        "spec.placement.zones[0]: must consist of letters",
    ),
    (
        "deny-shards-1e400",
        "/validate/valkeyclusters",
        "number out of range",
    ),
    (
        "deny-shards-2-pow-64",
        "/validate/valkeyclusters",
        "does not match its schema",
    ),
    (
        "deny-shards-2147483648",
        "/validate/valkeyclusters",
        "does not match its schema",
    ),
    (
        "deny-shards-negative-zero",
        "/validate/valkeyclusters",
        "does not match its schema",
    ),
    (
        "deny-unknown-operation",
        "/validate/valkeyclusters",
        "unknown variant `EXPLODE`",
    ),
    (
        "deny-v1beta1-review-api-version",
        "/validate/valkeyclusters",
        "this webhook speaks admission.k8s.io/v1",
    ),
    (
        "deny-wrong-kind-pod",
        "/validate/valkeyclusters",
        "this endpoint validates valkey.gomomento.com ValkeyCluster",
    ),
    (
        "emoji-and-rtl-in-annotation-value",
        "/validate/valkeyclusters",
        "",
    ),
];

#[test]
fn each_corpus_file_is_answered_for_its_own_reason() {
    let served = Served::start();
    let mut problems = Vec::new();
    for (name, path, reason) in CORPUS_REASONS {
        let body = std::fs::read(format!("{CORPUS}/{name}.json")).unwrap();
        let (status, text) = served
            .runtime
            .block_on(send(&served.server, path, body))
            .unwrap();
        let allowed = status == 200 && text.contains("\"allowed\":true");
        let expected = if name.starts_with("deny-") {
            !allowed && text.contains(reason)
        } else {
            allowed
        };
        if !expected {
            problems.push(format!("{name} on {path}: {status} {text}"));
        }
    }
    let files = std::fs::read_dir(CORPUS).unwrap().count();
    assert_eq!(
        files,
        CORPUS_REASONS.len(),
        "a corpus file without its reason here"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    served.stop_healthy();
}

// ---------------------------------------------------------------------------------------------
// (b) Typed specs through the pure validators.

fn kube_operation() -> impl Strategy<Value = Operation> {
    prop::sample::select(vec![
        Operation::Create,
        Operation::Update,
        Operation::Delete,
        Operation::Connect,
    ])
}

/// Names as a user might type them, and as an attacker would.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z]([-a-z0-9]{0,48}[a-z0-9])?",
        1 => "[a-z]{51,64}",
        1 => "[a-z0-9.-]{240,260}",
        2 => odd_string(),
        1 => prop::sample::select(vec!["standard", "large", "legacy", "reader", "missing"])
            .prop_map(String::from),
    ]
}

fn count() -> impl Strategy<Value = i32> {
    prop_oneof![
        2 => any::<i32>(),
        3 => -2..20i32,
        1 => 16380..16390i32,
        1 => prop::sample::select(vec![i32::MIN, i32::MAX, 0, -1, 2000, 2001, 100_000]),
    ]
}

fn annotation_key() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => "([a-z0-9]{1,10}\\.)?[a-z]{1,10}/[A-Za-z0-9_.-]{0,70}",
        2 => "[A-Za-z0-9_.-]{0,70}",
        2 => odd_string(),
    ]
}

fn acl_user() -> impl Strategy<Value = AclUser> {
    let key = (
        "[a-z:*?]{0,20}|.{250,260}|[a-z]{1,3} [+~(%@][a-z@*]{1,4}",
        prop::sample::select(vec![
            KeyAccess::Read,
            KeyAccess::Write,
            KeyAccess::Readwrite,
        ]),
    )
        .prop_map(|(pattern, access)| KeyPermission { pattern, access });
    let channel =
        "[a-z:*?]{0,20}|.{120,130}|[a-z]{1,3} [+~(&@][a-z@*]{1,4}".prop_map(ChannelPattern);
    let permission = (
        name(),
        prop::collection::vec(key, 0..3),
        prop::collection::vec(channel, 0..2),
    )
        .prop_map(|(role_ref, keys, channels)| AclPermission {
            role_ref,
            keys,
            channels,
        });
    (
        prop_oneof![3 => "[a-z]{1,10}", 1 => Just("default".to_string()), 1 => odd_string()],
        prop::collection::vec("[0-9a-f]{64}|.{0,10}".prop_map(PasswordHash), 0..3),
        prop::collection::vec(permission, 0..3),
        prop::option::of(
            (
                prop_oneof![name(), odd_string()],
                prop_oneof!["[a-z.]{1,10}", odd_string()],
            )
                .prop_map(|(name, key)| SecretKeyRef { name, key }),
        ),
    )
        .prop_map(
            |(username, password_hashes, permissions, password_secret_ref)| AclUser {
                username,
                password_hashes,
                permissions,
                password_secret_ref,
            },
        )
}

fn placement() -> impl Strategy<Value = Placement> {
    (
        prop::collection::vec(prop_oneof!["[a-z0-9-]{1,20}", odd_string()], 0..18),
        prop::option::of(prop::sample::select(vec![
            ZoneSpread::BestEffort,
            ZoneSpread::Required,
        ])),
        prop::collection::btree_map(annotation_key(), odd_string(), 0..4),
        prop::option::of(prop::sample::select(vec![
            PrimarySpreadPolicy::Rebalance,
            PrimarySpreadPolicy::Disabled,
        ])),
    )
        .prop_map(
            |(zones, zone_spread, node_selector, primary_spread)| Placement {
                zones,
                zone_spread,
                primary_spread,
                node_selector,
            },
        )
}

fn cluster_spec() -> impl Strategy<Value = ValkeyClusterSpec> {
    (
        name(),
        count(),
        count(),
        prop_oneof![
            4 => prop::collection::vec(acl_user(), 0..3),
            1 => prop::collection::vec(acl_user(), 64..67),
        ],
        prop::option::of(name().prop_map(|secret_ref| ClusterTls { secret_ref })),
        prop::option::of(placement()),
        prop::collection::btree_map(annotation_key(), odd_string(), 0..5),
        prop::option::of(network()),
    )
        .prop_map(
            |(
                config_ref,
                shards,
                replicas_per_shard,
                acl,
                tls,
                placement,
                pod_annotations,
                network,
            )| {
                ValkeyClusterSpec {
                    config_ref,
                    shards,
                    replicas_per_shard,
                    acl,
                    tls,
                    placement,
                    pod_annotations,
                    network,
                }
            },
        )
}

/// Client peers with odd label keys and values, some with no selector at all.
fn network() -> impl Strategy<Value = ClusterNetwork> {
    let labels = || {
        prop::option::of(
            prop::collection::btree_map(annotation_key(), odd_string(), 0..3)
                .prop_map(|match_labels| MatchLabels { match_labels }),
        )
    };
    let peer = move || {
        (labels(), labels()).prop_map(|(namespace_selector, pod_selector)| ClientPeer {
            namespace_selector,
            pod_selector,
        })
    };
    prop_oneof![
        4 => prop::collection::vec(peer(), 0..3),
        1 => prop::collection::vec(peer(), 16..18),
    ]
    .prop_map(|allowed_clients| ClusterNetwork { allowed_clients })
}

fn policy() -> impl Strategy<Value = Policy> {
    (prop::option::of(0..10usize), count(), count()).prop_map(
        |(fleet_roll_ack_threshold, max_shards, max_replicas_per_shard)| Policy {
            fleet_roll_ack_threshold,
            caps: Caps {
                max_shards,
                max_replicas_per_shard,
            },
            node_writer: Some("system:serviceaccount:valkey-operator:valkey-operator".into()),
        },
    )
}

/// What every verdict obeys: each reason says something.
fn check_verdict(verdict: &Verdict) -> Result<(), TestCaseError> {
    for reason in verdict.denials.iter().chain(&verdict.warnings) {
        prop_assert!(!reason.trim().is_empty(), "an empty reason in {verdict:?}");
    }
    Ok(())
}

/// A create or update without an object is denied; a delete or connect of a kind that only
/// checks writes is let through.
fn check_operation(
    operation: &Operation,
    has_object: bool,
    verdict: &Verdict,
) -> Result<(), TestCaseError> {
    if matches!(operation, Operation::Create | Operation::Update) && !has_object {
        prop_assert!(!verdict.allowed(), "a write without an object was allowed");
    }
    Ok(())
}

fn run_typed<S: Strategy>(
    label: &str,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    let cases = Cell::new(0usize);
    let result = runner(TYPED_CASES).run(&strategy, |value| {
        cases.set(cases.get() + 1);
        test(value)
    });
    println!("{label}: {} generated cases", cases.get());
    if let Err(error) = result {
        panic!("{label}: {error}");
    }
}

#[test]
fn typed_cluster_specs_never_panic_and_out_of_bounds_is_denied() {
    let fleet = fleet();
    let strategy = (
        kube_operation(),
        name(),
        prop::option::of(cluster_spec()),
        prop::option::of(cluster_spec()),
        policy(),
    );
    run_typed(
        "ValkeyCluster validator",
        strategy,
        |(operation, name, spec, old_spec, policy)| {
            let object = spec.map(|spec| ValkeyCluster::new(&name, spec));
            let old = old_spec.map(|spec| ValkeyCluster::new(&name, spec));
            let review = Review {
                operation: operation.clone(),
                name: &name,
                namespace: Some("team-d"),
                object: object.as_ref(),
                old: old.as_ref(),
                user: Some("tenant"),
                now: k8s_openapi::jiff::Timestamp::now(),
            };
            let verdict = validate_cluster(&review, &fleet, &policy);
            check_verdict(&verdict)?;
            check_operation(&operation, object.is_some(), &verdict)?;
            match (&operation, &object) {
                (Operation::Create | Operation::Update, Some(cluster)) => {
                    // An update is refused for what it makes worse: problems the old object
                    // already had are let through.
                    let known = old
                        .as_ref()
                        .map(|old| cluster_problems(&name, &old.spec))
                        .unwrap_or_default();
                    let new_problems = cluster_problems(&name, &cluster.spec)
                        .into_iter()
                        .filter(|problem| !known.contains(problem));
                    for problem in new_problems {
                        let problem = problem.to_string();
                        prop_assert!(
                            verdict.denials.contains(&problem),
                            "cluster_problems found {problem:?}, but the verdict is {verdict:?}"
                        );
                    }
                }
                (Operation::Delete | Operation::Connect, _) => {
                    prop_assert!(
                        verdict.allowed(),
                        "a {operation:?} was refused: {verdict:?}"
                    );
                }
                _ => {}
            }
            Ok(())
        },
    );
}

fn image_spec_strategy() -> impl Strategy<Value = ValkeyImageSpec> {
    let version = prop_oneof![
        "[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}(-rc[0-9])?",
        "[0-9]{1,25}(\\.[0-9]{1,25}){0,3}",
        odd_string(),
    ];
    (odd_string(), odd_string(), version).prop_map(|(repository, tag, version)| ValkeyImageSpec {
        repository,
        tag,
        version,
    })
}

fn config_spec_strategy() -> impl Strategy<Value = ValkeyConfigSpec> {
    let quantity = || {
        prop_oneof!["[0-9]{1,20}(m|Mi|Gi|Ti|k|M|G|e[0-9]{1,3})?", odd_string()].prop_map(Quantity)
    };
    let resources = (prop::option::of(quantity()), prop::option::of(quantity()))
        .prop_map(|(cpu, memory)| NodeResources { cpu, memory });
    let setting = prop_oneof![
        prop::sample::select(vec![
            "maxmemory",
            "maxmemory-policy",
            "hz",
            "port",
            "cluster-enabled",
            "dir",
            "bind",
            "appendonly",
            "save",
            "tls-port",
            "requirepass",
            "io-threads",
        ])
        .prop_map(String::from),
        "[a-z-]{1,30}",
        odd_string(),
    ];
    (
        prop::option::of(name()),
        prop::option::of(name()),
        prop::option::of(resources),
        prop::collection::btree_map(setting, odd_string(), 0..6),
        prop::option::of(prop::option::of(any::<u32>())),
    )
        .prop_map(
            |(image_ref, base_ref, resources, valkey, rollout)| ValkeyConfigSpec {
                image_ref,
                base_ref,
                resources,
                valkey,
                rollout: rollout.map(|max_concurrent| valkey_operator::api::RolloutPolicy {
                    max_concurrent,
                    ..Default::default()
                }),
                acl: None,
            },
        )
}

fn role_permission() -> impl Strategy<Value = Permission> {
    (
        odd_string(),
        prop::sample::select(vec![Access::Allow, Access::Deny]),
    )
        .prop_map(|(name, access)| Permission {
            name,
            subcommand: None,
            access,
        })
}

fn role_spec_strategy() -> impl Strategy<Value = ValkeyRoleSpec> {
    (
        prop::collection::vec(role_permission(), 0..6),
        prop::collection::vec(role_permission(), 0..6),
    )
        .prop_map(|(categories, commands)| ValkeyRoleSpec {
            categories,
            commands,
        })
}

fn node_strategy() -> impl Strategy<Value = ValkeyNode> {
    let spec = (
        name(),
        count(),
        odd_string(),
        image_spec_strategy(),
        odd_string(),
    )
        .prop_map(
            |(cluster, shard, image, version, revision)| ValkeyNodeSpec {
                cluster,
                shard,
                image,
                version: version.version,
                revision,
            },
        );
    (name(), spec, prop::option::of(any::<bool>()), odd_string()).prop_map(
        |(name, spec, controller, owner_kind)| {
            let mut node = ValkeyNode::new(&name, spec);
            node.metadata.owner_references = controller.map(|controller| {
                vec![OwnerReference {
                    api_version: "valkey.gomomento.com/v1alpha1".into(),
                    kind: if controller {
                        "ValkeyCluster".into()
                    } else {
                        owner_kind
                    },
                    name: "orders".into(),
                    uid: "u".into(),
                    controller: Some(controller),
                    block_owner_deletion: None,
                }]
            });
            node
        },
    )
}

fn review_of<'a, T>(
    operation: &Operation,
    name: &'a str,
    object: Option<&'a T>,
    old: Option<&'a T>,
) -> Review<'a, T> {
    Review {
        operation: operation.clone(),
        name,
        namespace: None,
        object,
        old,
        user: Some("tenant"),
        now: k8s_openapi::jiff::Timestamp::now(),
    }
}

#[test]
fn typed_specs_of_the_other_kinds_never_panic() {
    let fleet = fleet();
    let images = (
        kube_operation(),
        name(),
        prop::option::of(image_spec_strategy()),
        prop::option::of(image_spec_strategy()),
    );
    run_typed(
        "ValkeyImage validator",
        images,
        |(operation, name, spec, old)| {
            let object = spec.map(|spec| ValkeyImage::new(&name, spec));
            let old = old.map(|spec| ValkeyImage::new(&name, spec));
            let verdict = validate_image(
                &review_of(&operation, &name, object.as_ref(), old.as_ref()),
                &fleet,
            );
            check_verdict(&verdict)?;
            check_operation(&operation, object.is_some(), &verdict)
        },
    );
    let configs = (
        kube_operation(),
        name(),
        prop::option::of(config_spec_strategy()),
        prop::option::of(config_spec_strategy()),
        policy(),
    );
    run_typed(
        "ValkeyConfig validator",
        configs,
        |(operation, name, spec, old, policy)| {
            let object = spec.map(|spec| ValkeyConfig::new(&name, spec));
            let old = old.map(|spec| ValkeyConfig::new(&name, spec));
            let review = review_of(&operation, &name, object.as_ref(), old.as_ref());
            let verdict = validate_config(&review, &fleet, &policy);
            check_verdict(&verdict)?;
            check_operation(&operation, object.is_some(), &verdict)
        },
    );
    let roles = (
        kube_operation(),
        name(),
        prop::option::of(role_spec_strategy()),
    );
    run_typed("ValkeyRole validator", roles, |(operation, name, spec)| {
        let object = spec.map(|spec| ValkeyRole::new(&name, spec));
        let verdict = validate_role(
            &review_of(&operation, &name, object.as_ref(), None),
            &Fleet::default(),
        );
        check_verdict(&verdict)?;
        check_operation(&operation, object.is_some(), &verdict)
    });
    let nodes = (
        kube_operation(),
        prop::option::of(node_strategy()),
        prop::option::of(node_strategy()),
    );
    run_typed("ValkeyNode validator", nodes, |(operation, object, old)| {
        let name = object
            .as_ref()
            .and_then(|n| n.metadata.name.clone())
            .unwrap_or_default();
        let review = review_of(&operation, &name, object.as_ref(), old.as_ref());
        let verdict = validate_node(&review, &Policy::default());
        check_verdict(&verdict)?;
        check_operation(&operation, object.is_some(), &verdict)
    });
}
