{{- /* The Russian titles and descriptions of the module's capabilities (the ru.meta.deckhouse.io/* annotations),
kept in a file of Russian text of their own, as the module's other Russian texts are (doc-ru-*, *.ru.md). */}}
{{- define "peering.rbacv2.ru.systemView.title" -}}Модуль peering: просмотр{{- end -}}
{{- define "peering.rbacv2.ru.systemView.description" -}}Чтение ClusterPeer (без строк подключения), PeeringCapability, ProjectPeer и конфигурации модуля.{{- end -}}
{{- define "peering.rbacv2.ru.systemEdit.title" -}}Модуль peering: управление{{- end -}}
{{- define "peering.rbacv2.ru.systemEdit.description" -}}Управление ClusterPeer и чтение их строк подключения, управление PeeringCapability и конфигурацией модуля.{{- end -}}
{{- define "peering.rbacv2.ru.namespaceView.title" -}}Модуль peering: просмотр{{- end -}}
{{- define "peering.rbacv2.ru.namespaceView.description" -}}Чтение ProjectPeer пространства имён: пиров, с которыми связан его проект.{{- end -}}
