/*
 * completion.c: shell completion for mgectl. Commands, their flags, spec files for submit,
 * and job IDs (from `mgectl list`, with the server, token and config mgectl itself uses).
 *   bash: source <(mgectl completion bash)     or into /etc/bash_completion.d/mgectl
 *   zsh:  mgectl completion zsh > "${fpath[1]}/_mgectl"
 */
#include "completion.h"

#include <string.h>

static const char BASH[] =
    "# bash completion for mgectl (mgectl completion bash)\n"
    "_mgectl_ids() {\n"
    "    mgectl list --limit 50 2>/dev/null | awk 'NR > 1 { print $1 }'\n"
    "}\n"
    "_mgectl() {\n"
    "    local cur prev cmd i\n"
    "    cur=${COMP_WORDS[COMP_CWORD]}\n"
    "    prev=${COMP_WORDS[COMP_CWORD-1]}\n"
    "    cmd=\n"
    "    for ((i = 1; i < COMP_CWORD; i++)); do\n"
    "        case ${COMP_WORDS[i]} in\n"
    "            --server|--token|--token-file|--cacert|-o) ((i++)) ;;\n"
    "            -*) ;;\n"
    "            *) cmd=${COMP_WORDS[i]}; break ;;\n"
    "        esac\n"
    "    done\n"
    "    case $prev in\n"
    "        --token-file|--cacert) COMPREPLY=($(compgen -f -- \"$cur\")); return ;;\n"
    "        --server|--token|--set|--limit|--tail|--rank|--every|--name) return ;;\n"
    "        -o) [ \"$cmd\" = checkpoint ] && COMPREPLY=($(compgen -f -- \"$cur\")) ||\n"
    "                COMPREPLY=($(compgen -W 'json yaml table' -- \"$cur\")); return ;;\n"
    "        --state) COMPREPLY=($(compgen -W 'queued running succeeded failed cancelled' \\\n"
    "                 -- \"$cur\")); return ;;\n"
    "    esac\n"
    "    case $cmd in\n"
    "        '') COMPREPLY=($(compgen -W 'submit list get logs cancel workers drain metrics\n"
    "                checkpoint completion version --server --token-file --cacert --help' \\\n"
    "                -- \"$cur\")) ;;\n"
    "        submit) if [[ $cur == -* ]]; then\n"
    "                    COMPREPLY=($(compgen -W '-f --set --every -o' -- \"$cur\"))\n"
    "                else\n"
    "                    COMPREPLY=($(compgen -f -X '!*.@(yaml|yml|json)' -- \"$cur\") \\\n"
    "                               $(compgen -d -- \"$cur\"))\n"
    "                fi ;;\n"
    "        list) COMPREPLY=($(compgen -W '--state --limit -o' -- \"$cur\")) ;;\n"
    "        logs) COMPREPLY=($(compgen -W '-f --rank --tail --every $(_mgectl_ids)' \\\n"
    "                 -- \"$cur\")) ;;\n"
    "        get|metrics) COMPREPLY=($(compgen -W '-o --name $(_mgectl_ids)' -- \"$cur\")) ;;\n"
    "        cancel) COMPREPLY=($(compgen -W \"$(_mgectl_ids)\" -- \"$cur\")) ;;\n"
    "        checkpoint) if [ \"$prev\" = checkpoint ]; then\n"
    "                        COMPREPLY=($(compgen -W download -- \"$cur\"))\n"
    "                    else\n"
    "                        COMPREPLY=($(compgen -W '-o --name $(_mgectl_ids)' -- \"$cur\"))\n"
    "                    fi ;;\n"
    "        drain) COMPREPLY=($(compgen -W \"$(mgectl workers 2>/dev/null |\n"
    "                   awk 'NR > 1 { print $1 }')\" -- \"$cur\")) ;;\n"
    "        completion) COMPREPLY=($(compgen -W 'bash zsh' -- \"$cur\")) ;;\n"
    "    esac\n"
    "}\n"
    "shopt -s extglob 2>/dev/null\n"
    "complete -o filenames -F _mgectl mgectl\n";

static const char ZSH[] =
    "#compdef mgectl\n"
    "# zsh completion for mgectl (mgectl completion zsh > \"${fpath[1]}/_mgectl\")\n"
    "_mgectl_ids() {\n"
    "    local -a ids\n"
    "    ids=(${(f)\"$(mgectl list --limit 50 2>/dev/null | awk 'NR > 1 { print $1 \":\" $2 "
    "}')\"})\n"
    "    _describe 'job' ids\n"
    "}\n"
    "_mgectl() {\n"
    "    local -a cmds\n"
    "    cmds=(\n"
    "        'submit:submit a job spec' 'list:jobs, newest first' 'get:one job'\n"
    "        'logs:output of a job' 'cancel:cancel a job' 'workers:workers and their slots'\n"
    "        'drain:no new ranks on a worker' 'metrics:stored metrics'\n"
    "        'checkpoint:fetch a checkpoint' 'completion:shell completion script'\n"
    "        'version:mgectl version'\n"
    "    )\n"
    "    _arguments -C \\\n"
    "        '--server[coordinator URL]:url:' \\\n"
    "        '--token-file[file with the API token]:file:_files' \\\n"
    "        '--cacert[CA bundle for https]:file:_files' \\\n"
    "        '(-h --help)'{-h,--help}'[usage]' \\\n"
    "        '1:command:->cmd' '*::arg:->args'\n"
    "    case $state in\n"
    "        cmd) _describe 'command' cmds ;;\n"
    "        args)\n"
    "            case $words[1] in\n"
    "                submit) _arguments '-f[follow the job]' '*--set[key.path=value]:set:' \\\n"
    "                            '--every[seconds between progress lines]:seconds:' \\\n"
    "                            '-o[output]:format:(json)' '1:spec:_files -g "
    "\"*.(yaml|yml|json)\"' ;;\n"
    "                list) _arguments '--state[state]:state:(queued running succeeded failed "
    "cancelled)' \\\n"
    "                          '--limit[how many]:n:' '-o[output]:format:(json table)' ;;\n"
    "                logs) _arguments '-f[follow]' '--rank[rank]:rank:' '--tail[lines]:n:' \\\n"
    "                          '--every[seconds]:seconds:' '1:job:_mgectl_ids' ;;\n"
    "                get) _arguments '-o[output]:format:(json yaml table)' '1:job:_mgectl_ids' ;;\n"
    "                metrics) _arguments '--name[metric]:name:' '-o[output]:format:(json table)' "
    "\\\n"
    "                             '1:job:_mgectl_ids' ;;\n"
    "                cancel) _arguments '1:job:_mgectl_ids' ;;\n"
    "                checkpoint) _arguments '1:sub:(download)' '2:job:_mgectl_ids' \\\n"
    "                                '-o[file]:file:_files' '--name[checkpoint]:name:' ;;\n"
    "                completion) _arguments '1:shell:(bash zsh)' ;;\n"
    "            esac ;;\n"
    "    esac\n"
    "}\n"
    "compdef _mgectl mgectl\n";

int mgectl_completion_print(const char *shell, FILE *out)
{
    if (!strcmp(shell, "bash"))
        fputs(BASH, out);
    else if (!strcmp(shell, "zsh"))
        fputs(ZSH, out);
    else
        return -1;
    return 0;
}
