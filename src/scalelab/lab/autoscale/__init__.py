"""Autoscaling in one place: the Kubernetes HPA controller model (`hpa/`), one replica as
measured (`replica_model`), traffic curves (`traffic`), cold starts (`coldstart`) and the
simulator that replays a curve against replicas under the HPA (`simulator`)."""
