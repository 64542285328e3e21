//! ValkeyImage admission: the version floor, and images in use are immutable.

use super::*;
use crate::admission::fixtures::*;

#[test]
fn image_versions_against_the_floor() {
    let fleet = fleet();
    let table = [
        ("8.1.4", Some("below the Valkey 9 floor")),
        ("9.0.0", None),
        ("9.1.2", None),
        ("10.0.0", None),
        ("9.0.0-rc1", Some("pre-release")),
        ("nine", Some("\"nine\" is not a MAJOR.MINOR.PATCH version")),
        ("", Some("spec.version is empty")),
    ];
    for (version, denial) in table {
        let mut object = image("9.0.0");
        object.spec.version = version.into();
        let verdict = validate_image(
            &review(Operation::Create, "new-image", Some(&object), None),
            &fleet,
        );
        match denial {
            None => assert!(verdict.allowed(), "{version:?}: {}", joined(&verdict)),
            Some(fragment) => {
                assert!(
                    joined(&verdict).contains(fragment),
                    "{version:?}: {}",
                    joined(&verdict)
                );
                assert!(
                    joined(&verdict).starts_with("spec.version"),
                    "names the field"
                );
            }
        }
    }
}

#[test]
fn an_image_in_use_cannot_change_or_go() {
    let fleet = fleet();
    let old = image("9.0.0");
    let mut changed = old.clone();
    changed.spec.tag = "9.0.0-alpine".into();
    let update = validate_image(
        &review(
            Operation::Update,
            "valkey-9-0-0",
            Some(&changed),
            Some(&old),
        ),
        &fleet,
    );
    assert!(
        joined(&update).contains("used by 1 ValkeyConfig (standard)"),
        "{}",
        joined(&update)
    );
    assert!(joined(&update).contains("Register a new ValkeyImage"));

    let relabel = validate_image(
        &review(Operation::Update, "valkey-9-0-0", Some(&old), Some(&old)),
        &fleet,
    );
    assert!(relabel.allowed(), "metadata-only updates pass");

    let delete = validate_image(
        &review(Operation::Delete, "valkey-9-0-0", None, Some(&old)),
        &fleet,
    );
    assert!(joined(&delete).contains("cannot be deleted while 1 ValkeyConfig (standard) use it"));

    let unused = image("8.1.4");
    let delete_unused = validate_image(
        &review(Operation::Delete, "valkey-8-1-4", None, Some(&unused)),
        &fleet,
    );
    assert!(delete_unused.allowed());
}
