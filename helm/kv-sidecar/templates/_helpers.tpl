{{/* Chart name. */}}
{{- define "kv-sidecar.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-qualified name. */}}
{{- define "kv-sidecar.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Common labels. */}}
{{- define "kv-sidecar.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "kv-sidecar.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kv-sidecar
{{- end -}}

{{/* Selector labels. */}}
{{- define "kv-sidecar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kv-sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kv-sidecar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kv-sidecar.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The weight dtype the sidecar budgets for vLLM's --quantization. */}}
{{- define "kv-sidecar.weightDtype" -}}
{{- $q := lower (default "" .Values.vllm.quantization) -}}
{{- if or (eq $q "awq") (eq $q "gptq") (eq $q "awq_marlin") (eq $q "gptq_marlin") (eq $q "bitsandbytes") -}}int4
{{- else if eq $q "fp8" -}}fp8
{{- end -}}
{{- end -}}

{{/* Drafter, CPU offload, LoRA slots: the same flags for vLLM and the sidecar, whose prediction budgets them. */}}
{{- define "kv-sidecar.memoryArgs" -}}
{{- with .Values.vllm.speculativeConfig }}
- --speculative-config
- {{ toJson . | quote }}
{{- end }}
{{- with .Values.vllm.cpuOffloadGb }}
- --cpu-offload-gb
- {{ . | quote }}
{{- end }}
{{- if .Values.vllm.lora.enabled }}
- --enable-lora
- --max-loras
- {{ .Values.vllm.lora.maxLoras | quote }}
- --max-lora-rank
- {{ .Values.vllm.lora.maxLoraRank | quote }}
{{- if .Values.vllm.lora.fullySharded }}
- --fully-sharded-loras
{{- end }}
{{- with .Values.vllm.lora.targetModules }}
- --lora-target-modules
{{- range . }}
- {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* vLLM's arguments, from the one values block. */}}
{{/* Where vllm.chatTemplate is mounted in both containers, and its file name there. */}}
{{- define "kv-sidecar.chatTemplateDir" -}}/etc/kv-sidecar/chat-template{{- end -}}
{{- define "kv-sidecar.chatTemplateFile" -}}chat_template.jinja{{- end -}}

{{/* vLLM's chat flags, the same in both containers' arguments. */}}
{{- define "kv-sidecar.chatArgs" -}}
{{- if .Values.vllm.chatTemplate }}
- --chat-template
- {{ printf "%s/%s" (include "kv-sidecar.chatTemplateDir" .) (include "kv-sidecar.chatTemplateFile" .) | quote }}
{{- end }}
{{- with .Values.vllm.chatTemplateContentFormat }}
- --chat-template-content-format
- {{ . | quote }}
{{- end }}
{{- with .Values.vllm.defaultChatTemplateKwargs }}
- --default-chat-template-kwargs
- {{ toJson . | quote }}
{{- end }}
{{- end -}}

{{- define "kv-sidecar.vllmArgs" -}}
- --model
- {{ .Values.model.name | quote }}
{{- with .Values.model.revision }}
- --revision
- {{ . | quote }}
{{- end }}
- --served-model-name
- {{ default .Values.model.name .Values.model.servedModelName | quote }}
- --host
- "0.0.0.0"
- --port
- {{ .Values.vllm.port | quote }}
- --max-model-len
- {{ .Values.vllm.maxModelLen | quote }}
- --max-num-seqs
- {{ .Values.vllm.maxNumSeqs | quote }}
- --kv-cache-dtype
- {{ .Values.vllm.kvCacheDtype | quote }}
{{- with .Values.vllm.gpuMemoryUtilization }}
- --gpu-memory-utilization
- {{ . | quote }}
{{- end }}
- --tensor-parallel-size
- {{ .Values.vllm.tensorParallelSize | quote }}
- --pipeline-parallel-size
- {{ .Values.vllm.pipelineParallelSize | quote }}
- --data-parallel-size
- {{ .Values.vllm.dataParallelSize | quote }}
{{- if .Values.vllm.enableExpertParallel }}
- --enable-expert-parallel
{{- end }}
{{- with .Values.vllm.maxNumBatchedTokens }}
- --max-num-batched-tokens
- {{ . | quote }}
{{- end }}
{{- with .Values.vllm.quantization }}
- --quantization
- {{ . | quote }}
{{- end }}
{{- with .Values.vllm.blockSize }}
- --block-size
- {{ . | quote }}
{{- end }}
{{- with .Values.vllm.streamInterval }}
- --stream-interval
- {{ . | quote }}
{{- end }}
{{- include "kv-sidecar.memoryArgs" . }}
{{- include "kv-sidecar.chatArgs" . }}
{{- if .Values.vllm.enablePrefixCaching }}
- --enable-prefix-caching
{{- end }}
{{- range .Values.vllm.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* The sidecar's flags: the same settings, so its prediction describes what runs. */}}
{{- define "kv-sidecar.sidecarArgs" -}}
- run
- --upstream
- {{ printf "http://127.0.0.1:%v" .Values.vllm.port | quote }}
- --listen
- {{ printf "0.0.0.0:%v" .Values.sidecar.proxyPort | quote }}
- --admin-listen
- {{ printf "0.0.0.0:%v" .Values.sidecar.adminPort | quote }}
- --model
- {{ default .Values.model.name .Values.sidecar.modelConfig | quote }}
{{- if and .Values.model.revision (not .Values.sidecar.modelConfig) }}
- --revision
- {{ .Values.model.revision | quote }}
{{- end }}
- --max-model-len
- {{ .Values.vllm.maxModelLen | quote }}
- --max-num-seqs
- {{ .Values.vllm.maxNumSeqs | quote }}
- --kv-cache-dtype
- {{ .Values.vllm.kvCacheDtype | quote }}
{{- with .Values.vllm.gpuMemoryUtilization }}
- --gpu-memory-utilization
- {{ . | quote }}
{{- end }}
- --tensor-parallel-size
- {{ .Values.vllm.tensorParallelSize | quote }}
- --pipeline-parallel-size
- {{ .Values.vllm.pipelineParallelSize | quote }}
- --data-parallel-size
- {{ .Values.vllm.dataParallelSize | quote }}
{{- if .Values.vllm.enableExpertParallel }}
- --enable-expert-parallel
{{- end }}
{{- with .Values.vllm.maxNumBatchedTokens }}
- --max-num-batched-tokens
- {{ . | quote }}
{{- end }}
{{- with .Values.vllm.blockSize }}
- --block-size
- {{ . | quote }}
{{- end }}
{{- with .Values.vllm.streamInterval }}
- --stream-interval
- {{ . | quote }}
{{- end }}
{{- include "kv-sidecar.memoryArgs" . }}
{{- include "kv-sidecar.chatArgs" . }}
{{- /* vLLM flags set through extraArgs that change how the sidecar counts a prompt */}}
{{- $extraArgs := default (list) .Values.vllm.extraArgs }}
{{- if has "--exclude-tools-when-tool-choice-none" $extraArgs }}
- --exclude-tools-when-tool-choice-none
{{- end }}
{{- range $index, $arg := $extraArgs }}
{{- range $flag := list "--tokenizer" "--tokenizer-mode" "--tokenizer-revision" "--reasoning-effort-map" }}
{{- if and (eq (toString $arg) $flag) (lt (add1 $index) (len $extraArgs)) }}
- {{ $flag }}
- {{ index $extraArgs (add1 $index) | quote }}
{{- else if hasPrefix (printf "%s=" $flag) (toString $arg) }}
- {{ $arg | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- with (include "kv-sidecar.weightDtype" .) }}
- --weight-dtype
- {{ . | quote }}
{{- end }}
- --concurrency
- {{ .Values.sidecar.concurrency | quote }}
{{- with .Values.sidecar.gpu }}
- --gpu
- {{ . | quote }}
{{- end }}
{{- with .Values.sidecar.gpuMemory }}
- --gpu-memory
- {{ . | quote }}
{{- end }}
- --nvml
- {{ ternary "auto" "off" .Values.sidecar.nvml.enabled | quote }}
{{- with .Values.sidecar.admission.onPressure }}
- --on-pressure
- {{ . | quote }}
{{- end }}
{{- with .Values.sidecar.admission.mode }}
- --admission
- {{ . | quote }}
{{- end }}
{{- with .Values.sidecar.admission.pressureThreshold }}
- --pressure-threshold
- {{ . | quote }}
{{- end }}
{{- with .Values.sidecar.admission.releaseThreshold }}
- --release-threshold
- {{ . | quote }}
{{- end }}
{{- with .Values.sidecar.admission.pressureWindow }}
- --pressure-window
- {{ . | quote }}
{{- end }}
{{- with .Values.sidecar.admission.longPromptTokens }}
- --long-prompt-tokens
- {{ . | quote }}
{{- end }}
{{- with .Values.sidecar.admission.longLaneConcurrency }}
- --long-lane-concurrency
- {{ . | quote }}
{{- end }}
{{- with .Values.sidecar.admission.queueTimeout }}
- --queue-timeout
- {{ . | quote }}
{{- end }}
{{- with .Values.sidecar.admission.queueMaxEntries }}
- --queue-max-entries
- {{ . | quote }}
{{- end }}
{{- with .Values.sidecar.admission.stalePolicy }}
- --stale-policy
- {{ . | quote }}
{{- end }}
{{- with .Values.sidecar.maxBodyBytes }}
- --max-body-bytes
- {{ . | quote }}
{{- end }}
{{- with .Values.sidecar.scrapeInterval }}
- --scrape-interval
- {{ . | quote }}
{{- end }}
{{- with .Values.sidecar.calmScrapeInterval }}
- --calm-scrape-interval
- {{ . | quote }}
{{- end }}
- --drain-timeout
- {{ .Values.sidecar.drainTimeout | quote }}
{{- with .Values.sidecar.logLevel }}
- --log-level
- {{ . | quote }}
{{- end }}
{{- range .Values.sidecar.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}
