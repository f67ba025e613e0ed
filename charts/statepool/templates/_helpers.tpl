{{/*
Helpers of the statepool chart. Every daemon container, in every mode, is made by
"statepool.daemon" from the values, so the modes differ only where they must.
*/}}

{{/* The release's name for the objects it shares between modes (Service, ConfigMaps,
monitoring): the release name when it contains "statepool", else RELEASE-statepool, so
that a gpu and a cpu release live side by side in one namespace. */}}
{{- define "statepool.fullname" -}}
{{- if contains "statepool" .Release.Name -}}
{{- .Release.Name | trunc 53 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-statepool" .Release.Name | trunc 53 | trimSuffix "-" -}}
{{- end -}}
{{- end }}

{{- define "statepool.labels" -}}
app.kubernetes.io/name: statepoold
app.kubernetes.io/part-of: statepool
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* The image; the cuda backend's is the tag's -cuda variant. Arguments: root, cuda. */}}
{{- define "statepool.image" -}}
{{- $tag := .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- printf "%s:%s%s" .root.Values.image.repository $tag (ternary "-cuda" "" .cuda) -}}
{{- end }}

{{/* Seconds of a duration of the schema's form (N s, N m, N min). */}}
{{- define "statepool.seconds" -}}
{{- $d := toString . -}}
{{- if hasSuffix "min" $d -}}{{ mul (trimSuffix "min" $d | int) 60 }}
{{- else if hasSuffix "m" $d -}}{{ mul (trimSuffix "m" $d | int) 60 }}
{{- else -}}{{ trimSuffix "s" $d | int }}
{{- end -}}
{{- end }}

{{/* terminationGracePeriodSeconds of the node daemons: the drain timeout + 10 s. */}}
{{- define "statepool.grace" -}}
{{- add (include "statepool.seconds" .Values.daemon.drainTimeout | int) 10 -}}
{{- end }}

{{/* The daemons' statepoold.conf: what the pod spec does not set. */}}
{{- define "statepool.config" -}}
# statepoold.conf of the {{ .Values.mode }} daemons, from the chart's values (daemon.*).
# The container's args set what the pod spec must agree with and override these keys.
log-level    = {{ .Values.daemon.logLevel }}
grace-period = {{ .Values.daemon.gracePeriod }}
{{- with .Values.snapshots }}
{{- if ne (toString .hostCapacity) "0" }}
snapshot-host-capacity = {{ .hostCapacity }}
{{- end }}
{{- if ne (toString .remoteTtl) "0" }}
snapshot-remote-ttl = {{ .remoteTtl }}
{{- end }}
{{- end }}
{{- range .Values.daemon.tenants }}

[tenant.{{ .name }}]
{{- if .quota }}
quota = {{ .quota }}
{{- end }}
{{- if .uids }}
uids  = {{ join "," .uids }}
{{- end }}
{{- if .gids }}
gids  = {{ join "," .gids }}
{{- end }}
{{- end }}
{{- with .Values.daemon.extraConfig }}

{{ . }}
{{- end }}
{{ end }}

{{/*
The statepoold container. Arguments: root, name (of the container), backend, device
(cuda), pool, staging, workers, resources, socketDir (the mount holding the socket),
socketVolume, configVolume, sidecar (bool).
*/}}
{{- define "statepool.daemon" -}}
{{- $v := .root.Values -}}
- name: statepoold
  {{- if .sidecar }}
  restartPolicy: Always
  {{- end }}
  image: {{ include "statepool.image" (dict "root" .root "cuda" (eq .backend "cuda")) }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  command: ["/usr/local/bin/statepoold"]
  args:
    - --config=/etc/statepool/statepoold.conf
    - --socket={{ .socketDir }}/statepool.sock
    - --socket-mode={{ $v.daemon.socketMode }}
    - --metrics-address=0.0.0.0:{{ $v.daemon.metricsPort }}
    - --api-address={{ $v.daemon.apiAddress }}
    - --drain-timeout={{ $v.daemon.drainTimeout }}
    {{- if not .sidecar }}
    # The rolling update's hand-over (docs/operations.md §12.3).
    - --take-over=if-running
    - --after-handover=wait
    {{- end }}
    - --backend={{ .backend }}
    - --pool-capacity={{ .pool }}
    - --staging-capacity={{ .staging }}
    - --workers={{ .workers }}
    {{- if eq .backend "cuda" }}
    - --device={{ .device }}
    {{- end }}
    {{- if $v.daemon.plansConfigMap }}
    - --plan-dir=/etc/statepool/plans
    {{- end }}
    {{- if $v.snapshots.remoteSecret.name }}
    - --snapshot-remote=$(STATEPOOL_SNAPSHOT_REMOTE)
    {{- end }}
  {{- if or (eq .backend "cuda") $v.snapshots.remoteSecret.name }}
  env:
    {{- if eq .backend "cuda" }}
    # --device N counts every GPU of the node, as nvidia-smi and the device plugin do.
    - name: NVIDIA_VISIBLE_DEVICES
      value: all
    - name: NVIDIA_DRIVER_CAPABILITIES
      value: compute,utility
    - name: CUDA_DEVICE_ORDER
      value: PCI_BUS_ID
    {{- end }}
    {{- with $v.snapshots.remoteSecret }}
    {{- if .name }}
    - name: STATEPOOL_SNAPSHOT_REMOTE
      valueFrom:
        secretKeyRef:
          name: {{ .name }}
          key: {{ .key }}
    {{- end }}
    {{- end }}
  {{- end }}
  ports:
    - name: metrics
      containerPort: {{ $v.daemon.metricsPort }}
      protocol: TCP
  startupProbe:
    httpGet:
      path: /readyz
      port: metrics
    periodSeconds: {{ ternary 1 2 .sidecar }}
    failureThreshold: 60
  livenessProbe:
    httpGet:
      path: /healthz
      port: metrics
    periodSeconds: 10
    timeoutSeconds: 3
    failureThreshold: 3
  readinessProbe:
    httpGet:
      path: /readyz
      port: metrics
    periodSeconds: 5
    timeoutSeconds: 3
    failureThreshold: 2
  securityContext:
    runAsUser: {{ $v.daemon.uid }}
    runAsGroup: {{ $v.daemon.gid }}
    runAsNonRoot: true
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
  resources:
    {{- toYaml .resources | nindent 4 }}
  volumeMounts:
    - name: {{ .socketVolume }}
      mountPath: {{ .socketDir }}
    - name: {{ .configVolume }}
      mountPath: /etc/statepool
      readOnly: true
    {{- if $v.daemon.plansConfigMap }}
    - name: plans
      mountPath: /etc/statepool/plans
      readOnly: true
    {{- end }}
{{- end }}

{{/* The node daemons' pod-level settings shared by the gpu and cpu DaemonSets. */}}
{{- define "statepool.nodePodCommon" -}}
automountServiceAccountToken: false
enableServiceLinks: false
terminationGracePeriodSeconds: {{ include "statepool.grace" . }}
securityContext:
  runAsUser: {{ .Values.daemon.uid }}
  runAsGroup: {{ .Values.daemon.gid }}
  runAsNonRoot: true
  seccompProfile:
    type: RuntimeDefault
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The init container that gives the host socket directory to the daemon's uid. */}}
{{- define "statepool.socketDirInit" -}}
- name: socket-dir
  image: {{ include "statepool.image" . }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  command: ["chown", "{{ .root.Values.daemon.uid }}:{{ .root.Values.daemon.gid }}", "/run/statepool"]
  securityContext:
    runAsUser: 0
    runAsNonRoot: false
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
      add: ["CHOWN"]
  resources:
    requests: {cpu: 10m, memory: 16Mi}
    limits: {cpu: 100m, memory: 32Mi}
  volumeMounts:
    - name: socket
      mountPath: /run/statepool
{{- end }}

{{/* The config and plans volumes of a daemon pod. Arguments: root, configMap, configVolume. */}}
{{- define "statepool.configVolumes" -}}
- name: {{ .configVolume }}
  configMap:
    name: {{ .configMap }}
{{- with .root.Values.daemon.plansConfigMap }}
- name: plans
  configMap:
    name: {{ . }}
{{- end }}
{{- end }}
