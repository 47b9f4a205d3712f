use crate::PartitionError;

/// Saliency map of §4.1: `S_j = (1/|T|) * sum_{i in T} A[j, i]` for every latent token `j`,
/// where `A` is the cross-attention probability from latent token `j` to prompt token `i`
/// (row-major, `tokens x prompt_len`, already averaged over heads and layers by the caller)
/// and `T` the salient prompt tokens (`salient[i] == true`).
pub fn saliency_map(
    attn: &[f32],
    tokens: usize,
    salient: &[bool],
) -> Result<Vec<f32>, PartitionError> {
    let prompt_len = salient.len();
    let expected = tokens
        .checked_mul(prompt_len)
        .ok_or(PartitionError::LengthMismatch {
            what: "attn",
            expected: usize::MAX,
            got: attn.len(),
        })?;
    if attn.len() != expected {
        return Err(PartitionError::LengthMismatch {
            what: "attn",
            expected,
            got: attn.len(),
        });
    }
    if let Some((index, &value)) = attn
        .iter()
        .enumerate()
        .find(|(_, v)| !v.is_finite() || **v < 0.0)
    {
        return Err(PartitionError::BadValue {
            what: "attn",
            index,
            value,
        });
    }
    let chosen: Vec<usize> = (0..prompt_len).filter(|&i| salient[i]).collect();
    if chosen.is_empty() {
        return Err(PartitionError::NoSalientTokens);
    }
    let inv = 1.0 / chosen.len() as f32;
    Ok(attn
        .chunks_exact(prompt_len)
        .map(|row| chosen.iter().map(|&i| row[i]).sum::<f32>() * inv)
        .collect())
}

/// Checks that `values` has `len` finite, non-negative elements.
pub(crate) fn validate_map(
    what: &'static str,
    values: &[f32],
    len: usize,
) -> Result<(), PartitionError> {
    if values.len() != len {
        return Err(PartitionError::LengthMismatch {
            what,
            expected: len,
            got: values.len(),
        });
    }
    // Branch-free check a chunk at a time (vectorises); the scan for the culprit runs only
    // when there is one.
    let ok = |v: &f32| v.is_finite() & (*v >= 0.0);
    if values
        .chunks(64)
        .all(|c| c.iter().fold(true, |all, v| all & ok(v)))
    {
        return Ok(());
    }
    match values.iter().enumerate().find(|(_, v)| !ok(v)) {
        Some((index, &value)) => Err(PartitionError::BadValue { what, index, value }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn averages_salient_columns_only() {
        // 2 latent tokens x 3 prompt tokens; column 1 is a function word.
        let attn = [0.2, 0.7, 0.1, 0.5, 0.0, 0.5];
        let s = saliency_map(&attn, 2, &[true, false, true]).unwrap();
        assert!(
            (s[0] - 0.15).abs() < 1e-6 && (s[1] - 0.5).abs() < 1e-6,
            "{s:?}"
        );
    }

    #[test]
    fn refuses_bad_input() {
        assert!(matches!(
            saliency_map(&[0.0; 5], 2, &[true, true, true]),
            Err(PartitionError::LengthMismatch {
                what: "attn",
                expected: 6,
                got: 5
            })
        ));
        assert!(matches!(
            saliency_map(&[0.0, f32::NAN], 1, &[true, true]),
            Err(PartitionError::BadValue {
                what: "attn",
                index: 1,
                ..
            })
        ));
        assert_eq!(
            saliency_map(&[0.5, 0.5], 1, &[false, false]),
            Err(PartitionError::NoSalientTokens)
        );
    }
}
