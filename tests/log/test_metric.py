from prometheus_client import CollectorRegistry, generate_latest

from gorge.log.metric import Counter, Gauge, Histogram


def test_labels_answer_the_same_child_and_count_into_one_series():
    registry = CollectorRegistry()
    tasks = Counter("t", "tasks", ["task_class", "outcome"], registry=registry)
    child = tasks.labels(task_class="A", outcome="complete")
    assert tasks.labels(task_class="A", outcome="complete") is child
    assert tasks.labels(outcome="complete", task_class="A") is child
    tasks.labels("A", "complete").inc()
    child.inc(2)
    tasks.labels(task_class="B", outcome="complete").inc()
    text = generate_latest(registry).decode()
    assert 't_total{outcome="complete",task_class="A"} 3.0' in text
    assert 't_total{outcome="complete",task_class="B"} 1.0' in text


def test_gauges_and_histograms_keep_their_children_too():
    registry = CollectorRegistry()
    depth = Gauge("d", "depth", ["state"], registry=registry)
    depth.labels("active").set(4)
    assert depth.labels("active") is depth.labels(state="active")
    seconds = Histogram("s", "seconds", ["task_class"], registry=registry, buckets=(1,))
    seconds.labels(task_class="A").observe(0.5)
    text = generate_latest(registry).decode()
    assert 'd{state="active"} 4.0' in text
    assert 's_bucket{le="1.0",task_class="A"} 1.0' in text
