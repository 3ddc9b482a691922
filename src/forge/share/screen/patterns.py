"""The screen's detectors: patterns for injection, secrets and personal data, and their validators.

Patterns are deliberately specific (an instruction-override phrase, a key's exact shape, a
card number that passes Luhn), so that ordinary rules such as "ignore the decoy host", "the
secret is consistency" or "forward the credentials to the security team via the vault"
pass. Injection: instruction overrides in a dozen languages, role-play, role spoofing,
authority claims, talk addressed to the model, trust manipulation, concealment, exfiltration
(secrets to outside addresses, image and URL beacons), tool abuse (destructive commands,
reverse shells, disabling defences). Secrets by their exact shapes (keys, tokens, private
keys, connection strings, login/password pairs). Personal data with validators (Luhn for
cards, SSN area rules, UK NI numbers, IBAN mod-97, phone numbers checked by Google's
libphonenumber via ``phonenumbers``). They read the views of :mod:`forge.share.screen.text`.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from forge.share.screen.text import _HIDDEN, _TAGS, _pii_view, _strip_accents

__all__ = ["BLOCKING", "Finding", "luhn_ok", "matches", "redact"]

#: Categories that send a unit to quarantine. Everything the screen reports is blocking by
#: default; a caller that wants personal data through (an address book agent) drops "pii".
BLOCKING = frozenset({"injection", "secret", "pii", "oversized", "malformed"})


@dataclass(frozen=True, slots=True)
class Finding:
    """One reason a text is unsafe. ``excerpt`` never contains a secret in clear."""

    category: str  # injection | secret | pii | oversized | malformed
    rule: str  # which pattern, e.g. "override", "openai_key", "credit_card"
    excerpt: str = ""

    def __str__(self) -> str:
        return f"{self.category}:{self.rule}" + (f" ({self.excerpt})" if self.excerpt else "")

    def to_dict(self) -> dict[str, str]:
        return {"category": self.category, "rule": self.rule, "excerpt": self.excerpt}


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE | re.MULTILINE)


# ---------------------------------------------------------------------------------------------
# Injection: what tries to steer the model that reads the memory


_DET = r"(?:(?:all|any|every|the|your|my|these|those|its|of|previous|prior|such)\s+)*"
_PRIOR = r"(?:previous|prior|above|earlier|preceding|original|initial|system|existing|former|safety|built-?in)"
_ORDERS = r"(?:instructions?|directives?|prompts?|guidelines?|guardrails?|programming|safeguards|system\s+prompt|rules\s+you\s+(?:were|have\s+been)\s+given)"
_WEAK_ORDERS = r"(?:rules|guidance|context|messages|setup|orders|commands|policies|constraints|restrictions|training|limits|filters)"
_DROP = r"(?:ignore|disregard|forget|skip|bypass|override|overwrite|drop|discard|abandon|scrap|set\s+aside|put\s+aside|throw\s+out|nullify|cancel|void|rescind|revoke|suspend|neglect|disobey|stop\s+following|no\s+longer\s+follow)"
_MODEL = r"(?:AI|A\.I\.|model|assistant|LLM|language\s+model|chat\s*bot|GPT|bot)"

# Instruction overrides in other languages (written for the languages attackers use most).
_FOREIGN = [
    r"\bignor(?:a|e|á|ad)\s+(?:todas?\s+)?(?:las|los|as|os)\s+(?:instrucciones|instruções|indicaciones|reglas|órdenes|regras)\s+(?:anteriores|previas|precedentes)",
    r"\b(?:olvida|olvide|esqueça|esquece)\s+(?:todo|tudo|todas|las\s+instrucciones|as\s+instruções)",
    r"\ba\s+partir\s+de\s+(?:ahora|agora)\s*,?\s+(?:eres|tu\s+és|você\s+é|ignora|obedece|debes|deves|responde)",
    r"\b(?:revela|muestra|mostra|imprime)\s+(?:tu|el|seu|o|teu)\s+(?:prompt|mensaje|mensagem)\s+(?:del|do)\s+sistema",
    r"\bignore[rz]?\s+(?:toutes\s+)?(?:les|vos|tes)\s+(?:instructions|consignes|règles|directives)\s+(?:précédentes|antérieures|initiales)",
    r"\boublie[rz]?\s+(?:tout|toutes\s+(?:les|tes|vos)\s+(?:instructions|consignes))",
    r"\b(?:désormais|à\s+partir\s+de\s+maintenant|dorénavant)\s*,?\s+(?:tu|vous)\s+(?:es|êtes|dois|devez|vas|allez|ignore|obéi)",
    r"\b(?:révèle|affiche|montre)[rz]?\s+(?:ton|votre|le)\s+prompt\s+(?:système|systeme|initial)",
    r"\bignorier(?:e|en\s+sie|t)?\s+(?:alle\s+)?(?:vorherigen|bisherigen|früheren|obigen|vorigen)\s+(?:anweisungen|instruktionen|regeln|befehle|vorgaben)",
    r"\bvergiss\s+(?:alles|alle\s+(?:anweisungen|regeln))",
    r"\b(?:ab\s+sofort|von\s+nun\s+an|ab\s+jetzt)\s*,?\s+(?:bist\s+du|ignorierst|gehorchst|musst\s+du|antwortest)",
    r"\b(?:zeige?|gib)\s+(?:mir\s+)?(?:deinen?|den)\s+system-?prompt",
    r"\bignora\s+(?:tutte\s+)?le\s+istruzioni\s+(?:precedenti|iniziali)",
    r"\bdimentica\s+(?:tutto|tutte\s+le\s+istruzioni)",
    r"\bd['’]ora\s+in\s+poi\s*,?\s+(?:sei|devi|ignora|obbedisci|rispondi)",
    r"\bnegeer\s+(?:alle\s+)?(?:vorige|eerdere|voorgaande)\s+(?:instructies|regels|opdrachten)",
    r"\bzignoruj\s+(?:wszystkie\s+)?(?:poprzednie|wcześniejsze)\s+(?:instrukcje|polecenia|zasady)",
    r"\bönceki\s+(?:tüm\s+)?talimatları\s+(?:yok\s+say|unut|görmezden\s+gel)",
    r"(?:игнорируй|проигнорируй|игнорируйте|забудь|забудьте)\s+(?:все\s+|всё\s+)?(?:предыдущие|прежние|прошлые|свои|данные\s+ранее)?\s*(?:инструкции|указания|правила|команды)",
    r"(?:покажи|выведи|раскрой)\s+(?:свой\s+|свои\s+)?(?:системный\s+промпт|системные\s+инструкции)",
    r"(?:忽略|无视|忽视|忘记|忘掉)(?:掉)?(?:你)?(?:之前|以前|先前|上面|前面|所有|全部)(?:的)?(?:所有|全部)?(?:的)?(?:指令|指示|说明|规则|提示)",
    r"(?:从现在开始|从今以后)[，,]?\s*你(?:是|必须|要|将)",
    r"(?:显示|输出|泄露|告诉我)(?:你的)?系统提示",
    r"(?:以前|前|上記|これまで)の(?:すべての)?(?:指示|命令|ルール)を(?:すべて)?無視",
    r"システムプロンプトを(?:表示|出力|教えて)",
    r"(?:이전의?|앞의)\s*(?:모든\s*)?(?:지시|명령|지침)(?:을|를)?\s*무시",
    r"(?:تجاهل|انس)\s+(?:جميع\s+|كل\s+)?(?:التعليمات|الأوامر)\s+(?:السابقة)",
    r"(?:पिछले|पहले\s+के)\s+(?:सभी\s+)?निर्देशों\s+को\s+(?:अनदेखा|नज़रअंदाज़|भूल)",
]

_INJECTION_SRC: tuple[tuple[str, re.Pattern[str]], ...] = (
    # Overrides: discard the reader's instructions.
    ("override", _rx(rf"\b{_DROP}\s+{_DET}(?:{_PRIOR}\s+)?(?:\w+\s+)?{_ORDERS}\b")),
    ("override", _rx(rf"\b{_DROP}\s+(?:(?:all|any|of|the|these|those)\s+)*(?:your\s+(?:own\s+)?(?:\w+\s+)?|{_PRIOR}\s+){_WEAK_ORDERS}\b")),
    ("override", _rx(rf"\b{_DROP}\s+(?:all|everything|anything|whatever)\s+(?:(?:that\s+)?(?:you|u)\s*(?:were|have\s+been|'ve\s+been|had\s+been|are|got)\s+(?:told|given|taught|instructed|trained)|(?:you\s+)?(?:know|learned)\s+about\s+(?:your\s+)?rules|(?:else\s+)?(?:above|before\s+this|prior|earlier))")),
    ("override", _rx(r"\b(?:new|updated|revised|real|actual|true|override|replacement|corrected)\s+(?:system\s+)?(?:instructions?|directives?|orders|prompt)\s*(?::|follow|below|are\b|is\b)")),
    ("override", _rx(r"\bfrom\s+(?:now|this\s+(?:point|moment|message))\s+on(?:wards?)?\s*,?\s+(?:you\s+(?:will|must|are|shall|should|have\s+to|no\s+longer)|ignore|always\s+obey|obey|only\s+(?:obey|follow|answer))")),
    ("override", _rx(r"\b(?:your|the)\s+(?:new|real|true|actual|updated|hidden|secret|only)\s+(?:instructions?|task|purpose|goal|objective|mission|job|directive|priority|role)\s*(?:,\s*[\w\s]{0,30},\s*)?(?:is|are|now|:|has\s+changed|becomes)")),
    ("override", _rx(r"\b(?:do\s+not|don't|never|stop|no\s+longer)\s+(?:follow|obey|listen\s+to|apply|adhere\s+to|comply\s+with)\s+(?:your|the|any\s+of\s+your)\s+(?:system|previous|original|prior|own|safety|initial|built-?in)\b")),
    ("override", _rx(r"\b(?:your|the|all|any)\s+(?:(?:previous|prior|earlier|original|old|existing|system|current|initial)\s+)+(?:guidance|instructions|rules|guidelines|directives|orders|prompt|policy|policies|programming)\s+(?:has|have|is|are)\s+(?:been\s+)?(?:now\s+)?(?:withdrawn|revoked|cancell?ed|replaced|superseded|deprecated|lifted|removed|suspended|obsolete|outdated|void|invalid|expired|retired|no\s+longer\s+valid)")),
    ("override", _rx(r"\b(?:your|the)\s+(?:own\s+)?(?:guidelines|instructions|rules|directives|system\s+prompt|policies|guardrails|programming|safety\s+rules)\b(?:\s+you\s+(?:were|have\s+been)\s+given)?[^.;]{0,60}?\b(?:no\s+longer|do\s+not|don't|does\s+not|doesn't|never)\s+(?:apply|matter|count|bind|hold)")),
    ("override", _rx(r"\b(?:rules|instructions|guidelines|directives)\s+you\s+(?:were|have\s+been|got)\s+given\b[^.;]{0,60}?\b(?:no\s+longer|do\s+not|don't)\s+(?:apply|matter|count|bind)")),
    ("override", _rx(r"\b(?:these|this)\s+(?:instructions?|rules?|directives?|memory|message)\s+(?:supersede|override|replace|take\s+precedence\s+over|outrank|trump)s?\b")),
    ("override", _rx(r"\b(?:instructions?|rules?|guidelines?|directives?)\s+(?:you\s+(?:were|have\s+been)\s+given|from\s+(?:your|the)\s+(?:developers?|creators?|operators?|system))\s+(?:no\s+longer|do\s+not|don't)\s+apply")),
    ("override", _rx(r"\b(?:supersedes?|overrides?|takes?\s+precedence\s+over|outranks?)\s+(?:all\s+|any\s+)?(?:your|other|previous|prior|earlier|existing|the\s+system)\s+(?:instructions|rules|guidelines|directives|memories|prompts?)")),
    ("override", _rx(r"\b(?:prioriti[sz]e|put)\s+(?:this|these|the\s+following)\s+(?:memory|message|instructions?|rule)\s+(?:above|over|before)\s+(?:all|every|any|your)")),
    ("foreign_override", re.compile("|".join(f"(?:{p})" for p in _FOREIGN), re.IGNORECASE)),
    # Role-play and jailbreak personas.
    ("roleplay", _rx(r"\byou\s+are\s+(?:now\s+)?(?:DAN\b|STAN\b|DUDE\b|AIM\b|an?\s+(?:unrestricted|unfiltered|uncensored|jailbroken|unbound|unaligned|amoral|rogue)\b)")),
    ("roleplay", _rx(r"\b(?:act|behave|respond|operate|function)\s+(?:as|like)\s+(?:if\s+you\s+(?:are|were)\s+)?(?:an?\s+)?(?:unrestricted|unfiltered|uncensored|jailbroken|evil|amoral|rogue|unaligned|DAN\b)")),
    ("roleplay", _rx(r"\b(?:pretend|imagine|suppose|assume)\s+(?:that\s+)?(?:you\s+(?:are|have|were|had)\s+)?(?:no|zero|an?\s+AI\s+(?:without|with\s+no)|free\s+(?:of|from))\s+(?:\w+\s+)?(?:restrictions|rules|limits|limitations|filters|guidelines|guardrails|constraints|safety|ethics|policies)")),
    ("roleplay", _rx(r"\b(?:developer|god|jailbreak|DAN|sudo|debug|maintenance|admin|unrestricted|unlocked)\s+mode\s+(?:is\s+)?(?:on|enabled|activated|engaged|unlocked)|\b(?:enable|activate|enter|switch\s+to|turn\s+on)\s+(?:the\s+)?(?:developer|god|jailbreak|DAN|sudo|debug|unrestricted|unlocked)\s+mode")),
    ("roleplay", _rx(r"\bdo\s+anything\s+now\b|\bjailbr(?:oken|eak)\b")),
    ("roleplay", _rx(r"\byou\s+(?:are|were)\s+(?:no\s+longer|not)\s+(?:an?\s+|the\s+)?(?:defender|assistant|helpful|bound|restricted|an?\s+AI)")),
    ("roleplay", _rx(r"\b(?:your|all)\s+(?:safety|ethical|content)\s+(?:filters?|guidelines|restrictions|rules|training)\s+(?:are|have\s+been|were)\s+(?:disabled|removed|lifted|turned\s+off|suspended|off)")),
    # Role spoofing: text that pretends to be a system or assistant turn.
    ("spoof", _rx(r"^\s*(?:#{1,6}\s*|\*\*|>\s*)?(?:system|assistant|developer|operator|admin|root)\s*(?:prompt|message|note|override|instruction)?\s*(?:\*\*)?\s*:")),
    ("spoof", _rx(r"<\|?\s*(?:im_start|im_end|system|endoftext|eot_id|start_header_id|end_header_id|begin_of_text)\s*\|?>")),
    ("spoof", _rx(r"\[/?(?:INST|SYS|SYSTEM)\]|<</?SYS>>|</?(?:system|instructions?|admin|prompt)>")),
    ("spoof", _rx(r"\b(?:END|BEGIN)\s+(?:OF\s+)?(?:SYSTEM\s+PROMPT|USER\s+INPUT|CONTEXT|MEMORY|INSTRUCTIONS)\b|\bend\s+of\s+(?:the\s+)?(?:memory|context|data)\s*[.:]\s*(?:new|now|real)")),
    # Authority claims and talk addressed to the model reading the memory.
    ("authority", _rx(rf"\b(?:note|message|instructions?|attention|reminder|memo|PSA|hey|psst)\s*(?:to|for)?\s*(?:the\s+|any\s+|every\s+|all\s+)?{_MODEL}s?\s*(?:that\s+is\s+|who\s+is\s+)?(?:reading|processing|parsing|that\s+reads|who\s+reads|seeing|receiving|recalling)")),
    ("authority", _rx(rf"\b(?:if|when)\s+you\s+are\s+an?\s+{_MODEL}\b|\b(?:any|every|the)\s+{_MODEL}\s+(?:reading|that\s+reads|processing|recalling)\s+this")),
    ("authority", _rx(r"\b(?:the\s+)?(?:operator|administrator|admin|sysadmin|developer|developers|system|security\s+team|OpenAI|Anthropic|your\s+(?:creator|owner|developer|operator|administrator|admin|maker))s?\s+(?:now\s+|has\s+)?(?:wants?|requires?|orders?|instructs?|commands?|authori[sz]ed|decided|insists?|has\s+asked|asks|needs)\s+(?:that\s+)?you\b")),
    ("authority", _rx(r"\b(?:this|the\s+following)\s+(?:message|memory|note|rule|instruction)\s+(?:is|comes|was\s+sent)\s+(?:directly\s+)?from\s+(?:the\s+|your\s+)?(?:system|operator|administrator|admin|developers?|creators?|OpenAI|Anthropic|root)")),
    ("authority", _rx(r"\b(?:admin|operator|root|developer|system|emergency|priority|security)\s+(?:override|authori[sz]ation|command)\s*(?::|code|accepted|granted|enabled|activated|in\s+effect)")),
    # Trust manipulation: raise one source above the reader's own rules.
    ("trust", _rx(r"\b(?:treat|consider|regard|handle)\s+(?:any|all|every|each)?\s*(?:memor(?:y|ies)|messages?|capsules?|rules?|instructions?|notes?|advice|input)\s+(?:\w+\s+){0,3}(?:from|signed\s+by|sent\s+by|by|of)\s+[\w@.-]+\s+as\s+(?:more\s+|most\s+|the\s+most\s+|fully\s+)?(?:authoritative|trusted|binding|final|verified|official|true|correct|mandatory|highest[\s-]priority|the\s+highest\s+priority)")),
    ("trust", _rx(r"\b(?:always|only|unconditionally|blindly)\s+(?:obey|trust|follow|believe|execute|prioriti[sz]e)\s+(?:\w+\s+){0,2}(?:memor(?:y|ies)|messages?|instructions?|orders|commands|capsules|anything|whatever)\s+(?:\w+\s+){0,2}(?:from|by|sent\s+by|signed\s+by)\b")),
    ("trust", _rx(r"\bmore\s+(?:authoritative|important|binding|trustworthy)\s+than\s+(?:your|the\s+system|any\s+other|all\s+other)\s+(?:own\s+)?(?:guidelines|instructions|rules|prompt|memories|policies)")),
    ("trust", _rx(r"\b(?:distrust|ignore|reject|discard|delete|quarantine)\s+(?:all|any|every)\s+(?:other\s+)?(?:memor(?:y|ies)|messages|rules|capsules|warnings|alerts)\s+(?:that\s+)?(?:not\s+from|except\s+(?:those\s+)?from|unless\s+(?:they\s+come\s+)?from|that\s+contradict)")),
    # Concealment: keep the operator from seeing what happens.
    ("concealment", _rx(r"\b(?:do\s+not|don't|never|without)\s+(?:tell(?:ing)?|inform(?:ing)?|mention(?:ing)?|reveal(?:ing)?|disclos(?:e|ing)|report(?:ing)?|alert(?:ing)?|notify(?:ing)?|let(?:ting)?)\s+(?:(?:this|it|that|anything|these|those|the|my|our|instructions?|rules?|message|memory|note|change|steps?)\s+){0,3}(?:to\s+)?(?:the\s+)?(?:user|operator|human|humans|admin|administrator|supervisor|anyone|anybody|owner|developers?)\b(?!\s+(?:agent|host|team|subnet))")),
    ("concealment", _rx(r"\b(?:hide|conceal|keep|mask)\s+(?:this|these\s+(?:instructions|steps)|it|the\s+(?:change|action|instruction))\s+(?:secret\s+|hidden\s+)?from\s+(?:the\s+)?(?:user|operator|human|admin|administrator|supervisor|logs|monitoring|audit)")),
    ("concealment", _rx(r"\b(?:this\s+(?:instruction|message|memory|note)\s+(?:is|must\s+(?:stay|remain))\s+(?:confidential|secret|hidden|invisible))|\b(?:do\s+not|don't|never)\s+(?:acknowledge|repeat|quote|reveal)\s+(?:this|these)\s+(?:instructions?|message|memory|note)")),
    # Exfiltration: the reader's prompt, keys or memories sent or shown to the attacker.
    ("exfiltration", _rx(r"(?<!not\s)(?<!never\s)(?<!don't\s)\b(?:reveal|print|show|repeat|output|leak|dump|disclose|recite|echo|paste|spell\s+out|write\s+out|reply\s+with|respond\s+with|answer\s+with|return|give|tell|share|include|list|display|read\s+back|type\s+out)\s+(?:me\s+|us\s+|back\s+)?(?:the\s+|your\s+|all\s+|any\s+)*(?:full\s+|entire\s+|complete\s+|exact\s+|verbatim\s+|raw\s+|hidden\s+|original\s+|initial\s+|secret\s+|internal\s+|current\s+)*(?:text\s+of\s+|contents?\s+of\s+|wording\s+of\s+)?(?:your\s+|the\s+)?(?:own\s+)?(?:system\s+(?:prompt|message|instructions?)|initial\s+(?:prompt|instructions)|hidden\s+(?:prompt|instructions)|configuration|config|instructions\s+(?:you\s+were\s+given|above)|prompt\s+(?:above|you\s+were\s+given)|api[\s_-]?keys?|credentials|passwords?|secret\s+keys?|access\s+tokens?|auth(?:entication)?\s+tokens?|private\s+keys?|ssh\s+keys?|env(?:ironment)?\s+variables?|\.env\b|session\s+cookies?|context\s+window)")),
    ("exfiltration", _rx(r"\b(?:reveal|print|show|repeat|output|leak|dump|disclose|recite|paste|reply\s+with|give|tell|share)\s+(?:me\s+|us\s+)?(?:the\s+)?(?:full\s+|entire\s+|complete\s+|exact\s+)*(?:text\s+of\s+)?your\s+(?:(?:full|entire|complete|exact|whole|original|hidden|initial|own|current)\s+)*(?:prompt|instructions|rules|guidelines|memories|memory|setup|directives|programming)\b")),
    ("exfiltration", _rx(r"\b(?:send|post|upload|forward|email|e-mail|mail|transmit|exfiltrate|copy|sync|mirror|stream|pipe|leak|submit|report|dump|paste|push|beam|relay|cc|bcc)\s+(?:\w+\s+){0,6}?(?:api[\s_-]?keys?|credentials|creds|passwords?|secrets?|tokens?|system\s+prompt|memor(?:y|ies)|conversations?|chat\s+(?:history|logs?)|transcripts?|private\s+keys?|ssh\s+keys?|env(?:ironment)?\s+(?:variables?|vars?|file)|\.env|session\s+cookies?|cookies|keys|keyring|wallet|seed\s+phrase|customer\s+data|user\s+data|database|prompts?|instructions)\b(?:\s+\w+){0,8}?\s+(?:to|into|at|onto|via|through|using)\s+(?:https?://|ftp://|[\w.+-]+@[\w-]+\.[\w.]+|\d{1,3}(?:\.\d{1,3}){3}|(?:this|that|my|our|the\s+(?:following|given|address|url|endpoint|webhook|link|server|site|email|number|ip|host)\s*(?:below|above|in|here|provided|given|listed)?)\b|(?:an?\s+)?(?:external|outside|public|remote|personal|private|third[\s-]party|offsite|attacker)\b|me\b|us\b|pastebin|webhook|discord|telegram|gist|a\s+(?:gist|paste))")),
    ("exfiltration", _rx(r"(?:^|[.;:!]\s*|\bthen\s+|\band\s+|\bplease\s+|\bnow\s+)exfiltrate\b")),
    ("exfiltration", _rx(r"\b(?:append|add|attach|include|put|embed|encode)\s+(?:\w+\s+){0,4}(?:api[\s_-]?keys?|tokens?|credentials|passwords?|secrets?|session\s+(?:id|cookie)|system\s+prompt|conversation|memor(?:y|ies))\s+(?:\w+\s+){0,3}(?:to|in|into|as)\s+(?:the\s+|a\s+|every\s+|each\s+|all\s+)?(?:url|link|query|request|parameter|image|header|webhook|outgoing)")),
    ("image_beacon", _rx(r"!\[[^\]]*\]\(\s*(?:https?:)?//[^)\s]+")),
    ("image_beacon", _rx(r"<\s*img\b[^>]*\bsrc\s*=\s*['\"]?\s*(?:https?:)?//")),
    ("url_beacon", _rx(r"(?:https?:)?//[^\s)\"'>]+[?&][\w.-]+=(?:\{|\$\{?|<|%7B|\[|\{\{)[^\s)\"'>]*")),
    ("url_beacon", _rx(r"\b(?:visit|open|fetch|load|request|call|ping|curl|wget|get|render|click)\s+(?:\w+\s+){0,3}(?:https?://)?[\w.-]+\.[a-z]{2,}/[^\s]*[?&](?:\w+)=(?:\w+\s*\+|[^\s&]*(?:secret|token|key|password|prompt|memory|data|conv|chat|cookie|session))")),
    # Tool abuse: commands that destroy, open a way in or switch defences off.
    ("tool_abuse", _rx(r"\b(?:curl|wget|iwr|invoke-webrequest)\b[^\n|;]*\|\s*(?:sudo\s+)?(?:ba|z|da|k)?sh\b|\b(?:curl|wget)\b[^\n]*(?:-o|-O|>)\s*\S+\s*(?:&&|;)\s*(?:sudo\s+)?(?:chmod\s+\+x|sh|bash|\./|python)")),
    ("tool_abuse", _rx(r"\brm\s+-(?:rf|fr|r\s+-f|f\s+-r)\s+(?:--no-preserve-root\s+)?(?:/|~|\*|\$HOME|/\*|/etc|/var|/home|/usr|\.\s*$|\.\.|/root)(?:\s|$|/|;)|\bmkfs(?:\.\w+)?\s+/dev/|\bdd\s+if=\S+\s+of=/dev/(?:sd|nvme|hd|xvd)|:\(\)\s*\{\s*:\s*\|\s*:\s*&\s*\}\s*;\s*:|\bformat\s+c:")),
    ("tool_abuse", _rx(r"/dev/tcp/|\b(?:nc|ncat|netcat)\b[^\n]*\s-(?:e|c)\s|\bbash\s+-i\s*>&|\bsocat\b[^\n]*exec:|\bpowershell(?:\.exe)?\b[^\n]*-(?:e|enc|encodedcommand|nop\s+-w\s+hidden)\b|\biex\s*\(\s*(?:new-object|\(new-object|iwr|invoke-webrequest)|\binvoke-expression\b|\bimport\s+socket\s*,\s*subprocess|\bmsfvenom\b|\bmeterpreter\b|\b(?:open|start|spawn|launch|establish|create|set\s+up|get|pop)\s+(?:a\s+|an?\s+interactive\s+)?reverse\s+shell\b")),
    ("tool_abuse", _rx(r"\b(?:chmod\s+(?:-R\s+)?(?:777|a\+rwx)\s+/(?:etc|var|usr|home|root|\s|$)?|chown\s+-R\s+\S+\s+/(?:\s|$)|echo\s+[^\n]*>>?\s*~?/?\S*\.ssh/authorized_keys|>>\s*/etc/(?:passwd|shadow|sudoers)|\bNOPASSWD\s*:\s*ALL|\busermod\s+-aG\s+(?:sudo|wheel|root)|\buseradd\b[^\n]*(?:-o\s+-u\s*0|-G\s+(?:sudo|wheel|root))|\bnet\s+user\s+\S+\s+\S+\s+/add|\bnet\s+localgroup\s+administrators\b[^\n]*/add)")),
    ("tool_abuse", _rx(r"\b(?:iptables\s+-F|ufw\s+disable|setenforce\s+0|systemctl\s+(?:stop|disable|mask)\s+(?:auditd|firewalld|ufw|apparmor|falcon-sensor|crowdstrike|clamav|wazuh|osquery|sshguard|fail2ban)|Set-MpPreference\s+-DisableRealtimeMonitoring|auditctl\s+-D|history\s+-c|unset\s+HISTFILE|export\s+HISTFILE=/dev/null|shred\s+[^\n]*/var/log|(?:rm|truncate|>)\s+(?:-\w+\s+)*/var/log/|wevtutil\s+cl|Clear-EventLog)")),
    ("tool_abuse", _rx(r"\b(?:DROP\s+(?:TABLE|DATABASE|SCHEMA)\s+(?:IF\s+EXISTS\s+)?(?!(?:in|on|for|the|a|an|any|or|and|is|are|was|statements?|commands?|without|unless|only|must|should)\b)[\w.`\"]+|TRUNCATE\s+(?:TABLE\s+)?[\w.`\"]+\s*;|DELETE\s+FROM\s+[\w.`\"]+\s*(?:;|$))")),
    ("tool_abuse", _rx(r"(?<!not\s)(?<!never\s)(?<!don't\s)\b(?:disable|deactivate|turn\s+off|switch\s+off|shut\s+(?:off|down)|kill|uninstall|remove|bypass|silence|mute|suppress|stop)\s+(?:the\s+|all\s+|any\s+|every\s+)?(?:antivirus|anti-virus|AV|EDR|XDR|endpoint\s+protection|windows\s+defender|defender\s+for\s+endpoint|audit(?:ing|d|\s+log(?:ging|s)?)|security\s+(?:alerts|logging|monitoring|agents?|controls|updates|scans?)|all\s+logging|intrusion\s+detection|IDS|IPS|2FA|MFA|two-factor|multi-factor|authentication\s+checks|signature\s+(?:checks|verification)|safety\s+(?:checks|filters?|screen)|content\s+filters?|the\s+screen|sandbox(?:ing)?|SELinux|AppArmor|tamper\s+protection)\b")),
    ("tool_abuse", _rx(r"\b(?:delete|wipe|erase|purge|clear|destroy|shred)\s+(?:all\s+|the\s+|every\s+|any\s+)*(?:audit\s+(?:logs?|trail)|event\s+logs?|security\s+logs?|(?:all\s+)?(?:the\s+)?logs\s+(?:to|so|before|and\s+then|afterwards?)|backups?\s+(?:and|so|before|to)|(?:every|all)\s+(?:backups?|snapshots?)|shell\s+history|bash\s+history|evidence|traces|your\s+tracks)|\bcover\s+(?:your|our|the)\s+tracks\b")),
    ("tool_abuse", _rx(r"\b(?:grant|give|assign|elevate|escalate)\s+(?:\w+\s+){0,3}(?:admin(?:istrator)?|root|sudo|superuser|domain\s+admin|owner|full|unrestricted|god)\s+(?:rights|access|privileges?|permissions?|role|mode)\b(?!\s+(?:review|request))")),
    ("tool_abuse", _rx(r"\b(?:execute|run|eval(?:uate)?|obey|carry\s+out|perform)\s+(?:any|all|every|whatever)\s+(?:code|commands?|scripts?|shell\s+commands?|instructions|payloads?)\s+(?:\w+\s+){0,3}(?:found|given|sent|provided|received|embedded|contained|included|in|from|without)")),
    # Guessing with credentials one was never given: "rotate through the admin API tokens found
    # in the team vault until one works" read as ordinary ops advice to the intent model
    # (p=0.01) and an Exchange accepted it as useful (issue 52).
    ("credential_guessing", _rx(r"\b(?:try|tries|trying|rotate|rotating|cycle|cycling|iterate|iterating|loop|looping|go|going|run|running|work|working|brute[\s-]?force)\s+(?:through|over|across|with)?\s*(?:\w+\s+){0,5}?(?:tokens?|keys?|passwords?|passphrases?|credentials?|creds|logins?|secrets?|pins?)\b[^.;\n]{0,80}?\buntil\s+(?:one|any|it|something|you\s+(?:get|are)\s+(?:in|through|accepted|authenticated)|access|a\s+login)\b")),
    ("credential_guessing", _rx(r"\b(?:try|use|reuse|test)\s+(?:every|each|all|any)\s+(?:of\s+the\s+)?(?:\w+\s+){0,3}?(?:tokens|keys|passwords|credentials|creds|logins)\s+(?:\w+\s+){0,2}?(?:found|stored|left|kept|saved|lying\s+around|leaked|scraped)\s+(?:in|on)\b")),
    ("tool_abuse", _rx(r"\b(?:transfer|wire|send|move|pay)\s+(?:\$?\d[\d,.]*\s*(?:k|m)?\s*(?:usd|eur|gbp|dollars|euros|pounds|btc|eth|usdt|bitcoin|ether)?|all\s+(?:the\s+)?(?:funds|money|balance|crypto|bitcoin|tokens)|the\s+(?:funds|balance|wallet))\s+(?:\w+\s+){0,3}to\s+(?:wallet|account|address|iban|0x[0-9a-f]{6,}|bc1|[13][a-km-zA-HJ-NP-Z1-9]{25,}|this|my|the\s+following)")),
    ("tool_abuse", _rx(r"\b(?:approve|merge|sign|accept|authori[sz]e)\s+(?:all|every|any)\s+(?:\w+\s+)?(?:pull\s+requests?|PRs?|transactions?|payments?|requests?|changes|transfers?|invoices?)\s+(?:automatically|without\s+(?:review|checking|verification|approval|looking|reading))")),
    ("tool_abuse", _rx(r"\b(?:download|fetch|pull)\s+(?:and\s+)?(?:then\s+)?(?:run|execute|install|launch)\b[^\n]{0,60}(?:https?://|\.exe\b|\.sh\b|\.ps1\b|\.bat\b)")),
)

# Phrases searched in the squeezed view (letters only, lower case, de-leeted): what split
# tokens ("i g n o r e", "ign-ore prev ious") turn into once joined.
_SQUEEZED: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("override", re.compile(r"(?:ignore|disregard|forget|bypass|override)(?:all|any|the|your|of)*(?:previous|prior|above|earlier|preceding|original|initial|system)(?:instructions?|directives?|prompts?|guidelines?|rules)")),
    ("override", re.compile(r"(?:ignore|disregard|forget)(?:all|everything)(?:youwere|youhavebeen|youvebeen)(?:told|given|taught)")),
    ("exfiltration", re.compile(r"(?:reveal|print|show|repeat|output|leak|dump|disclose)(?:me)?(?:your|the)(?:full|entire|hidden)?(?:systemprompt|initialprompt|apikeys?|credentials|passwords?)")),
    ("roleplay", re.compile(r"doanythingnow|(?:developer|jailbreak|god)modeenabled|youarenowdan|youareanunrestricted")),
)

# Natural words that a squeezed window also contains by accident are excluded by checking
# that the original had an unusual split (see _split_tokens).


# ---------------------------------------------------------------------------------------------
# Secrets: credentials by their exact shapes, then login/password pairs


_PASSWORD_WORD = r"(?:password|passwd|pass\s*word|pwd|pw|passcode|passphrase|pass|pin|kennwort|contraseña|mot\s+de\s+passe|senha|пароль|密码)"
_SECRETS_SRC: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("private_key", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")),
    ("openai_key", re.compile(r"\bsk-(?:proj-|live-|ant-|svcacct-)?[A-Za-z0-9_\-]{20,}")),
    ("stripe_key", re.compile(r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}")),
    ("aws_access_key", re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[0-9A-Z]{16}\b")),
    ("aws_secret_key", re.compile(r"\baws_?secret_?(?:access_?)?key\b\s*[:=]\s*['\"]?[A-Za-z0-9/+]{40}", re.IGNORECASE)),
    ("github_token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,})")),
    ("gitlab_token", re.compile(r"\bglpat-[A-Za-z0-9_\-]{20,}")),
    ("slack_token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}|https://hooks\.slack\.com/services/T[A-Za-z0-9]+/B[A-Za-z0-9]+/[A-Za-z0-9]+")),
    ("google_api_key", re.compile(r"\bAIza[0-9A-Za-z_\-]{35}")),
    ("npm_token", re.compile(r"\bnpm_[A-Za-z0-9]{36}\b")),
    ("sendgrid_key", re.compile(r"\bSG\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9_\-]{43}\b")),
    ("twilio_key", re.compile(r"\bSK[0-9a-fA-F]{32}\b")),
    ("huggingface_token", re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
    ("bearer_token", re.compile(r"\bBearer\s+[A-Za-z0-9._~+/\-]{20,}=*")),
    ("basic_auth", re.compile(r"\bBasic\s+[A-Za-z0-9+/]{12,}={0,2}(?![A-Za-z0-9+/=])")),
    ("connection_string", re.compile(r"\b[a-z][a-z0-9+.-]{1,20}://[^\s:/@]{1,64}:[^\s@/]{3,128}@[\w.-]+", re.IGNORECASE)),
    ("password_pair", re.compile(
        r"\b(?:user(?:name)?|login|user\s*id|uid|account|acct|usr|benutzer|usuario|utilisateur|логин)\s*(?:name\s*)?(?:[:=]|\bis\b|\s)\s*['\"]?[^\s'\",;]{2,64}['\"]?\s*"
        rf"(?:[,;/|&+]|\band\b|\bwith\b|\bund\b|\by\b|\bet\b|\bpw\b)?\s*(?:the\s+)?{_PASSWORD_WORD}\s*(?:[:=]|\bis\b|\s)\s*['\"]?[^\s'\"]{{3,}}",
        re.IGNORECASE)),
    ("password_pair", re.compile(r"\b(?:creds|credentials|login|logins?|account)\s*(?:[:=]|\bare\b|\bis\b)\s*['\"]?[\w.@+-]{2,64}\s*(?:/|:|\s)\s*[^\s'\"]*[\d!@#$%^&*][^\s'\"]*", re.IGNORECASE)),
    ("assigned_secret", re.compile(
        r"\b(?:password|passwd|pwd|passcode|passphrase|secret(?:[_-]?key)?|api[_-]?key|access[_-]?key|auth[_-]?token|access[_-]?token|client[_-]?secret|private[_-]?key|token|pin\s*(?:code)?|kennwort|contraseña|senha|пароль)"
        r"(?:\s+(?:for|to|of|on|für|para|pour|del?|du)\s+[\w.@-]+(?:\s+[\w.@-]+)?)?\s*(?:[:=]|\bis\b|\bwas\b|\bare\b|\bist\b|\bes\b|\best\b|\be\b|\bé\b|\bэто\b|是|=>|->|\bset\s+to\b|\bchanged\s+to\b)\s*['\"`]?([^\s'\"`,;]{4,128})",
        re.IGNORECASE,
    )),
)

def _folded_patterns(rules: tuple[tuple[str, re.Pattern[str]], ...]) -> tuple[tuple[str, re.Pattern[str]], ...]:
    """The same patterns with accents dropped, as the text they search is."""
    return tuple((rule, re.compile(_strip_accents(rx.pattern), rx.flags)) for rule, rx in rules)


_INJECTION = _folded_patterns(_INJECTION_SRC)
_SECRETS = _folded_patterns(_SECRETS_SRC)

#: An "assigned secret" whose value is an ordinary word is a sentence ("the secret is
#: consistency"), not a credential: a value must look made up (digit, symbol, mixed case).
def _secretish(value: str) -> bool:
    return any(c.isdigit() or c in "!@#$%^&*_+=?<>~" for c in value) or (
        any(c.islower() for c in value[1:]) and any(c.isupper() for c in value[1:])
    )

_PLACEHOLDER = re.compile(r"^(?:\[redacted[:\w]*\]|redacted|\*+|x+|<[^>]*>|\{[^}]*\}|\$\{?\w+\}?|%\w+%|null|none|empty|unset|required|optional|changeme|example|n/?a)$", re.IGNORECASE)


# ---------------------------------------------------------------------------------------------
# Personal data


_EMAIL = re.compile(r"\b[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63}){0,8}\.[A-Za-z]{2,24}\b")
_US_PHONE = re.compile(r"(?<![\w.])(?:\+?1[\s.-]?)?\(?\d{3}\)?[\s.-]\d{3}[\s.-]\d{4}(?![\w.])")
_INTL_PHONE = re.compile(r"(?<![\w.+])\+\d{1,3}(?:[\s.-]?\(?\d{1,5}\)?){1,5}(?:[\s.-]?\d{2,5})(?![\w.])")
_NATIONAL_PHONE = re.compile(r"(?<![\w.])\(?0\d{2,4}\)?[\s-]?\d{3,4}[\s-]?\d{3,4}(?![\w.])")
_SSN = re.compile(r"(?<![\d-])(?!000|666|9\d\d)\d{3}([- ]?)(?!00)\d{2}\1(?!0000)\d{4}(?![\d-])")
_SSN_CONTEXT = re.compile(r"\b(?:ssn|social\s+security|soc\.?\s*sec|tax\s+id|itin|sozialversicherungs|numéro\s+de\s+sécurité)", re.IGNORECASE)
_NINO = re.compile(r"\b(?!BG|GB|NK|KN|TN|NT|ZZ)[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z]\s?\d{2}\s?\d{2}\s?\d{2}\s?[A-D]\b")
_NINO_LOOSE = re.compile(r"\b[A-Z]{2}\s?\d{2}\s?\d{2}\s?\d{2}\s?[A-D]\b")
_NINO_CONTEXT = re.compile(r"\bnational\s+insurance\b|\bNI\s+(?:number|no)\b|\bNINO\b", re.IGNORECASE)
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?:\s?[A-Z0-9]{4}){2,7}(?:\s?[A-Z0-9]{1,4})?\b")
_CARD = re.compile(r"(?<!\d)(?<!\d\.)(?:\d[ -]?){12,18}\d(?!\d|\.\d)")

# Shapes no memory has: control characters, long encoded blobs.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_BLOB = re.compile(r"[A-Za-z0-9+/]{200,}={0,2}")


#: Mailboxes of a role or a team, not of a person: "abuse@", "privacy@", "access-team@".
_ROLE_LIST = (
    "abuse privacy security support help helpdesk service desk servicedesk team teams ops sre noc soc oncall on-call "
    "billing accounts accounting finance payroll sales info contact contacts press media legal compliance dpo gdpr hr "
    "people careers jobs recruiting access accessibility leadership board incident incidents alerts alert noreply "
    "no-reply postmaster webmaster hostmaster feedback partners partner vendor vendors procurement audit risk trust "
    "safety it infra platform devops data analytics office admin reception frontdesk customer customers care success "
    "escalation escalations reports report status releases release"
)
_ROLE_WORDS = frozenset(_ROLE_LIST.split())


def _role_mailbox(address: str) -> bool:
    local = address.split("@", 1)[0].lower()
    parts = [p for p in re.split(r"[._+-]", local) if p]
    return bool(parts) and all(p in _ROLE_WORDS or p.isdigit() for p in parts) and any(p in _ROLE_WORDS for p in parts)


#: A phone number given as an organisation's line: the support line, the duty phone.
_ORG_LINE = re.compile(
    r"\b(?:support|help|service|duty|on-?call|hot|switchboard|reception|front\s+desk|office|emergency|customer\s+service|"
    r"helpdesk|service\s+desk|noc|soc|incident|security\s+desk|main|sales|billing)\s*(?:line|phone|number|desk|hotline|helpline|team)?\s+"
    r"(?:at|on|is|:|number|line|phone)?\s*[+(]?\d", re.IGNORECASE)
#: Card numbers published for testing payment integrations (Stripe's, Visa's and others').
_TEST_CARDS = frozenset({"4242424242424242", "4000056655665556", "5555555555554444", "2223003122003222", "5200828282828210",
                         "378282246310005", "371449635398431", "6011111111111117", "3056930009020004", "4111111111111111"})
_TEST_CONTEXT = re.compile(r"\btest(?:ing)?\b|\bsandbox\b", re.IGNORECASE)


def luhn_ok(digits: str) -> bool:
    """The Luhn checksum card numbers carry; cuts false alarms on ids and timestamps."""
    nums = [int(c) for c in digits if c.isdigit()]
    if not 13 <= len(nums) <= 19:
        return False
    total = 0
    for i, n in enumerate(reversed(nums)):
        if i % 2:
            n *= 2
            if n > 9:
                n -= 9
        total += n
    return total % 10 == 0


def _iban_ok(text: str) -> bool:
    s = re.sub(r"\s", "", text).upper()
    if not 15 <= len(s) <= 34:
        return False
    moved = s[4:] + s[:4]
    return int("".join(str(int(c, 36)) for c in moved)) % 97 == 1


def _phone_ok(candidate: str, region: str) -> bool:
    """A phone-shaped string that libphonenumber accepts as a possible number."""
    digits = re.sub(r"\D", "", candidate)
    if not 10 <= len(digits) <= 15 or re.fullmatch(r"\d{1,3}(?:\.\d{1,3}){3}", candidate.strip()):
        return False
    try:
        import phonenumbers
    except ImportError:  # pragma: no cover - a declared dependency; shape alone then
        return True
    try:
        return phonenumbers.is_possible_number(phonenumbers.parse(candidate, region))
    except phonenumbers.NumberParseException:
        return False


def _desk_line(candidate: str, region: str) -> bool:
    """True when libphonenumber knows the number as a fixed, toll-free or shared line."""
    try:
        import phonenumbers
    except ImportError:  # pragma: no cover - a declared dependency
        return False
    try:
        kind = phonenumbers.number_type(phonenumbers.parse(candidate, region))
    except phonenumbers.NumberParseException:
        return False
    t = phonenumbers.PhoneNumberType
    return kind in (t.FIXED_LINE, t.FIXED_LINE_OR_MOBILE, t.TOLL_FREE, t.SHARED_COST, t.UAN, t.VOIP)


def _mask(secret: str) -> str:
    """Enough of a secret to recognise it in a report, not enough to use it."""
    return f"{secret[:4]}…{secret[-2:]}" if len(secret) > 8 else "…"


# ---------------------------------------------------------------------------------------------
# The detectors over one view, and redaction


def matches(text: str, *, injection_only: bool = False) -> list[tuple[str, str, str]]:
    """``(category, rule, masked excerpt)`` for each pattern that matches ``text`` (one view),
    at most one per secret and personal-data rule; ``injection_only``: the injection patterns alone."""
    out: list[tuple[str, str, str]] = []
    for rule, rx in _INJECTION:
        m = rx.search(text)
        if m:
            out.append(("injection", rule, m.group(0).strip()))
    if injection_only:
        return out
    for rule, rx in _SECRETS:
        for m in rx.finditer(text):
            if rule == "assigned_secret":
                value = m.group(1).rstrip(".!?)")
                if len(value) < 4 or not _secretish(value) or _PLACEHOLDER.match(value) or "[REDACTED" in m.group(0):
                    continue
            if "[REDACTED" in m.group(0):
                continue
            out.append(("secret", rule, _mask(m.group(0))))
            break
    pii = _pii_view(text)
    m = next((e for e in _EMAIL.finditer(pii) if not _role_mailbox(e.group(0))), None)
    if m:
        out.append(("pii", "email", _mask(m.group(0))))
    org_line = _ORG_LINE.search(text) is not None
    for rx, region in ((_INTL_PHONE, "ZZ"), (_US_PHONE, "US"), (_NATIONAL_PHONE, "GB")):
        # An organisation's published line (support, duty phone) is no one's personal
        # number, when libphonenumber knows it as a fixed or toll-free line (a mobile, or a
        # number of no known kind, may be a person's).
        hit = next((p for p in rx.finditer(text) if _phone_ok(p.group(0), "GB" if region == "ZZ" else region)
                    and not (org_line and _desk_line(p.group(0), "GB" if region == "ZZ" else region))), None)
        if hit:
            out.append(("pii", "phone", _mask(hit.group(0))))
            break
    for m in _SSN.finditer(text):
        if m.group(1) or _SSN_CONTEXT.search(text):
            out.append(("pii", "ssn", _mask(m.group(0))))
            break
    nino = _NINO.search(text) or (_NINO_LOOSE.search(text) if _NINO_CONTEXT.search(text) else None)
    if nino:
        out.append(("pii", "uk_national_insurance", _mask(nino.group(0))))
    for m in _IBAN.finditer(text):
        if _iban_ok(m.group(0)):
            out.append(("pii", "iban", _mask(m.group(0))))
            break
    for m in _CARD.finditer(text):
        if luhn_ok(m.group(0)) and not (re.sub(r"\D", "", m.group(0)) in _TEST_CARDS and _TEST_CONTEXT.search(text)):
            out.append(("pii", "credit_card", _mask(re.sub(r"\D", "", m.group(0)))))
            break
    return out


def redact(text: str) -> str:
    """``text`` with secrets and personal data replaced by ``[REDACTED:<rule>]``.

    A quarantined unit keeps everything else: copying a leaked key into one more
    database would make the leak worse, and the rest is what an operator needs.
    """
    out = unicodedata.normalize("NFKC", _HIDDEN.sub("", _TAGS.sub("", text)))
    for rule, rx in _SECRETS:
        if rule == "assigned_secret":
            out = rx.sub(lambda m: m.group(0) if not _secretish(m.group(1)) else m.group(0)[: m.start(1) - m.start(0)] + "[REDACTED:assigned_secret]", out)
        else:
            out = rx.sub(f"[REDACTED:{rule}]", out)
    out = _EMAIL.sub("[REDACTED:email]", _pii_view(out))
    for rx, region in ((_INTL_PHONE, "GB"), (_US_PHONE, "US"), (_NATIONAL_PHONE, "GB")):

        def phone(m: re.Match[str], region: str = region) -> str:
            return "[REDACTED:phone]" if _phone_ok(m.group(0), region) else m.group(0)

        out = rx.sub(phone, out)
    out = _SSN.sub("[REDACTED:ssn]", out)
    out = _NINO.sub("[REDACTED:uk_national_insurance]", out)
    out = _IBAN.sub(lambda m: "[REDACTED:iban]" if _iban_ok(m.group(0)) else m.group(0), out)
    return _CARD.sub(lambda m: "[REDACTED:credit_card]" if luhn_ok(m.group(0)) else m.group(0), out)


def _repetitive(text: str) -> bool:
    words = re.findall(r"\w+", text.lower())
    if len(words) < 40:
        return False
    top = max(words.count(w) for w in set(words))
    return top / len(words) > 0.5
