//! Running totals per key, exactly once from Kafka to Kafka: each input value is an integer;
//! the job writes the key's new total, keyed by the same key.

use onceflow::prelude::*;

fn main() {
    KafkaJob::from_command_line("totals").main(|input, out| {
        let totals = input
            .map(|m: KafkaMessage| {
                let key = String::from_utf8_lossy(&m.key.unwrap_or_default()).into_owned();
                let value = String::from_utf8_lossy(&m.payload.unwrap_or_default()).into_owned();
                (key, value.trim().parse::<i64>().unwrap_or(0))
            })
            .key_by(|(key, _): &(String, i64)| key.clone())
            .process(
                "totals",
                |(key, n): (String, i64), ctx: &mut KeyedContext<'_, String, SinkRecord>| {
                    let total = {
                        let mut state = ctx.value::<i64>("total")?;
                        let t = state.get().copied().unwrap_or(0) + n;
                        state.set(t);
                        t
                    };
                    ctx.emit(SinkRecord::new(
                        Some(key.into_bytes()),
                        total.to_string().into_bytes(),
                    ));
                    Ok(())
                },
            );
        out.sink("totals-out", &totals);
    })
}
