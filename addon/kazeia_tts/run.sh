#!/usr/bin/with-contenv bashio
# Maps the add-on's options to the server's flags (one flag per option), and the MQTT service,
# when Home Assistant has one, to the MQTT bridge.
set -e

flags=(
    --uri "tcp://0.0.0.0:10200"
    --data-dir /data
    --model "$(bashio::config 'model')"
    --quant "$(bashio::config 'quant')"
    --threads "$(bashio::config 'threads')"
)
if bashio::config.has_value 'voice'; then
    flags+=(--voice "$(bashio::config 'voice')")
fi
if bashio::config.has_value 'voice_model'; then
    flags+=(--voice-model "$(bashio::config 'voice_model')")
fi
if bashio::config.true 'debug'; then
    flags+=(--debug)
fi
if bashio::services.available 'mqtt'; then
    flags+=(
        --mqtt-host "$(bashio::services 'mqtt' 'host')"
        --mqtt-port "$(bashio::services 'mqtt' 'port')"
        --mqtt-username "$(bashio::services 'mqtt' 'username')"
        --mqtt-password "$(bashio::services 'mqtt' 'password')"
    )
fi

exec /opt/kazeia/bin/python -m wyoming_kazeia "${flags[@]}"
