//! The Valkey 9 version floor: resharding relies on `CLUSTER MIGRATESLOTS`, which Valkey 9
//! introduced, so no engine below 9.0.0 may enter the fleet by any path.

use semver::Version;

/// The lowest engine version the operator runs.
pub const FLOOR: Version = Version::new(9, 0, 0);

/// Why a version string cannot run, phrased to follow the field that holds it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VersionProblem {
    #[error("is empty; give the engine version as MAJOR.MINOR.PATCH, e.g. \"9.1.2\"")]
    Empty,
    #[error("{0:?} is not a MAJOR.MINOR.PATCH version; write it like \"9.1.2\"")]
    NotSemver(String),
    #[error(
        "{0} is a pre-release, which sorts below 9.0.0, the Valkey 9 floor; use a released 9.x.y version"
    )]
    PreReleaseBelowFloor(String),
    #[error(
        "{0} is below the Valkey 9 floor (9.0.0): resharding needs CLUSTER MIGRATESLOTS, which Valkey 9 introduced; use an image of Valkey 9.0.0 or newer"
    )]
    BelowFloor(String),
}

/// Parses an engine version and checks it against [`FLOOR`] (semantic-version precedence, so a
/// pre-release of 9.0.0 is below 9.0.0).
pub fn check_floor(version: &str) -> Result<Version, VersionProblem> {
    if version.trim().is_empty() {
        return Err(VersionProblem::Empty);
    }
    let parsed =
        Version::parse(version).map_err(|_| VersionProblem::NotSemver(version.to_string()))?;
    if parsed >= FLOOR {
        Ok(parsed)
    } else if !parsed.pre.is_empty() && parsed.major == FLOOR.major {
        Err(VersionProblem::PreReleaseBelowFloor(version.to_string()))
    } else {
        Err(VersionProblem::BelowFloor(version.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_table() {
        let table: &[(&str, Result<(), &str>)] = &[
            ("8.1.4", Err("is below the Valkey 9 floor")),
            ("9.0.0", Ok(())),
            ("9.1.2", Ok(())),
            ("10.0.0", Ok(())),
            ("9.0.0-rc1", Err("is a pre-release")),
            ("nine", Err("is not a MAJOR.MINOR.PATCH version")),
            ("", Err("is empty")),
            ("9.0", Err("is not a MAJOR.MINOR.PATCH version")),
            ("v9.1.2", Err("is not a MAJOR.MINOR.PATCH version")),
            ("9.1.0-rc1", Ok(())),
            ("8.99.99", Err("is below the Valkey 9 floor")),
        ];
        for (version, expected) in table {
            let got = check_floor(version);
            match (expected, &got) {
                (Ok(()), Ok(v)) => assert_eq!(v.to_string(), *version),
                (Err(fragment), Err(problem)) => assert!(
                    problem.to_string().contains(fragment),
                    "{version:?}: {problem} lacks {fragment:?}"
                ),
                _ => panic!("{version:?}: expected {expected:?}, got {got:?}"),
            }
        }
    }
}
